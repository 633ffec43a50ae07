"""`nvidia-smi topo -m` (and `topo -p2p`) matrices, and what they mean for NCCL (F10).

Matrices arrive with their tabs expanded to spaces, so the trailing "CPU Affinity" /
"NUMA Affinity" / "GPU NUMA ID" columns do not line up: rows are split on whitespace and
the affinity values read from the right (a blank CPU affinity - containers, Slurm - simply
leaves fewer tokens). NIC rows carry no affinity at all.
"""

from __future__ import annotations

import re

from sm120.doctor.snapshot import Topology

_DEVICE = r"GPU\d+|NIC\d+|mlx\d+_\d+"
_LINK = r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|C2C"
DEVICE = re.compile(rf"^({_DEVICE})$")
LINK_LABEL = re.compile(rf"^({_LINK})$")
P2P_LABEL = re.compile(r"^(X|OK|CNS|GNS|TNS|NS|DR|U|NP)$")
# A lost tab glues neighbours together ("NIC8NIC9", "NODENODE"): split them again.
_GLUED_DEVICES = re.compile(rf"^(?:{_DEVICE}){{2,}}$")
_GLUED_LINKS = re.compile(r"^(?:NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|C2C){2,}$")
AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
PCIE_LABELS = {"PIX", "PXB", "PHB", "NODE", "SYS", "SOC"}


def tokens(line: str) -> list[str]:
    """Whitespace-split, with glued neighbours split apart."""
    out: list[str] = []
    for token in line.split():
        if _GLUED_DEVICES.match(token):
            out.extend(re.findall(_DEVICE, token))
        elif _GLUED_LINKS.match(token):
            out.extend(re.findall(_LINK, token))
        else:
            out.append(token)
    return out


def header_devices(line: str) -> tuple[list[str], list[str]] | None:
    """The device columns and the affinity columns of a matrix header, or None."""
    if "|" in line or "," in line:
        return None
    tokens_ = tokens(line)
    devices: list[str] = []
    for token in tokens_:
        if DEVICE.match(token):
            devices.append(token)
        else:
            break
    if not devices or devices[0] != "GPU0":
        return None
    rest = " ".join(tokens_[len(devices) :])
    extras = [name for name in AFFINITY_COLUMNS if name in rest]
    leftover = rest
    for name in extras:
        leftover = leftover.replace(name, "")
    if leftover.strip():
        return None
    return devices, extras


def matrix_rows(lines: list[str], devices: list[str]) -> list[list[str]]:
    """The rows under a header, up to the first line that is not one."""
    rows: list[list[str]] = []
    for line in lines:
        row = tokens(line)
        if not row:
            if rows:
                break
            continue
        if row[0] not in devices or len(row) < len(devices) + 1:
            break
        rows.append(row)
    return rows


def is_p2p_matrix(rows: list[list[str]], devices: list[str]) -> bool:
    cells = [cell for row in rows for cell in row[1 : len(devices) + 1]]
    return bool(cells) and all(P2P_LABEL.match(c) for c in cells) and any(c != "X" for c in cells)


def parse_topology(header: str, lines: list[str], legend: list[str]) -> Topology | None:
    found = header_devices(header)
    if found is None:
        return None
    devices, extras = found
    rows = matrix_rows(lines, devices)
    topo = Topology(devices=devices)
    for row in rows:
        source, labels = row[0], row[1 : len(devices) + 1]
        if not all(LINK_LABEL.match(label) for label in labels):
            return None
        for target, label in zip(devices, labels, strict=True):
            if source == target:
                continue
            _add_link(topo, source, target, label)
        if source.startswith("GPU"):
            topo.affinity[source] = _affinity(row[len(devices) + 1 :], extras)
    for line in legend:
        if match := _NIC_LEGEND.match(line):
            topo.nic_names[match.group(1)] = match.group(2)
    return topo


def parse_p2p(header: str, lines: list[str]) -> dict[str, str] | None:
    found = header_devices(header)
    if found is None:
        return None
    devices, _ = found
    rows = matrix_rows(lines, devices)
    if not is_p2p_matrix(rows, devices):
        return None
    status: dict[str, str] = {}
    for row in rows:
        for target, label in zip(devices, row[1 : len(devices) + 1], strict=True):
            if row[0] != target:
                status[pair_key(row[0], target)] = label
    return status


def pair_key(a: str, b: str) -> str:
    def order(name: str) -> tuple[int, int]:
        digits = re.findall(r"\d+", name)
        return (0 if name.startswith("GPU") else 1, int(digits[-1]) if digits else 0)

    first, second = sorted((a, b), key=order)
    return f"{first}-{second}"


def _add_link(topo: Topology, source: str, target: str, label: str) -> None:
    gpu_pair = source.startswith("GPU") and target.startswith("GPU")
    if gpu_pair:
        topo.links[pair_key(source, target)] = label
    elif source.startswith("GPU") or target.startswith("GPU"):
        topo.nic_links[pair_key(source, target)] = label


def _affinity(values: list[str], extras: list[str]) -> dict[str, str | None]:
    # Read from the right: a blank CPU affinity is the value that goes missing.
    out: dict[str, str | None] = {name: None for name in extras}
    for name, value in zip(reversed(extras), reversed(values), strict=False):
        out[name] = None if value == "N/A" else value
    return {_affinity_key(k): v for k, v in out.items()}


def _affinity_key(column: str) -> str:
    return column.lower().replace(" ", "_")


def interconnect(topo: Topology | None) -> str | None:
    """'nvlink' when every GPU pair has NVLink, 'mixed' when some do, 'pcie' when none."""
    if topo is None or not topo.links:
        return None
    kinds = {"nvlink" if label.startswith("NV") else "pcie" for label in topo.links.values()}
    return kinds.pop() if len(kinds) == 1 else "mixed"
