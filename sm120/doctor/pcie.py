"""The host question behind a published figure: how each GPU's PCIe link runs, and whether a
PCIe switch sits between the GPUs (F34).

The same image and checkpoint decoded at 39.6 tok/s on an EPYC 9565 box whose GPUs sit behind
a PCIe switch, against ~88 on the publisher's host (local-inference-lab/rtx6kpro#25): a
published figure only transfers to a host built like the one it was measured on. This module
reads `nvidia-smi -q` link blocks and judges links and topology; it runs nothing.
"""

from __future__ import annotations

import re

from sm120.doctor.findings import Finding
from sm120.doctor.needs import Needs
from sm120.doctor.snapshot import GpuInfo, Snapshot

# `nvidia-smi -q` starts each GPU's block with its bus id on a line of its own.
QUERY_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)$")
_VALUE = re.compile(r"^\s*([A-Za-z][A-Za-z ]*?)\s*:\s*(.*?)\s*$")
# `topo -m` words for a path through PCIe bridges only, below the CPU's host bridge: the GPUs
# share a PCIe switch (PIX: one bridge, PXB: several).
SWITCH_LABELS = ("PIX", "PXB")
ROOT_PORT_LABELS = ("PHB", "NODE", "SYS", "SOC")
SOURCE = "local-inference-lab/rtx6kpro#25"


def _number(text: str) -> int | None:
    match = re.match(r"^(\d+)x?$", text.strip())
    return int(match.group(1)) if match else None


def parse_query_block(lines: list[str], start: int) -> tuple[GpuInfo, int]:
    """One GPU of `nvidia-smi -q` from its `GPU <bus id>` line: its name, bus id and PCIe
    link; returns the GPU and the index of the line after its block."""
    header = QUERY_GPU_HEADER.match(lines[start].strip())
    gpu = GpuInfo(bus_id=header.group(1) if header else None)
    section: list[str] = []  # the headings above the current line, by indentation
    end = start + 1
    while end < len(lines) and not QUERY_GPU_HEADER.match(lines[end].strip()):
        line = lines[end]
        if line.strip() and not line.startswith("    "):
            break  # the block is indented by spaces: what follows is another output
        end += 1
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 4
        found = _VALUE.match(line)
        if found is None:
            section = [*section[: max(depth - 1, 0)], line.strip()]
            continue
        key, value = found.groups()
        where = section[max(depth - 2, 0) :] if section else []
        if key == "Product Name" and gpu.name is None:
            gpu.name = value
        elif where and where[-1] == "PCIe Generation" and key in ("Max", "Current"):
            setattr(gpu, f"pcie_gen_{key.lower()}", _number(value))
        elif where and where[-1] == "Link Width" and key in ("Max", "Current"):
            setattr(gpu, f"pcie_width_{key.lower()}", _number(value))
    return gpu, end


def _narrow_links(gpus: list[GpuInfo]) -> list[str]:
    return [
        f"GPU{gpu.index} x{gpu.pcie_width_current} of x{gpu.pcie_width_max}"
        for gpu in gpus
        if gpu.pcie_width_current and gpu.pcie_width_max
        if gpu.pcie_width_current < gpu.pcie_width_max
    ]


def _slow_links(gpus: list[GpuInfo]) -> list[str]:
    return [
        f"GPU{gpu.index} Gen {gpu.pcie_gen_current} of {gpu.pcie_gen_max}"
        for gpu in gpus
        if gpu.pcie_gen_current and gpu.pcie_gen_max
        if gpu.pcie_gen_current < gpu.pcie_gen_max
    ]


def check_pcie_links(snapshot: Snapshot | None) -> list[Finding]:
    """Each GPU's link width and generation against what the slot and card can do."""
    if snapshot is None:
        return []
    # A capture with only the maxima (the doctor's CSV query asks pcie.link.gen.max) says
    # nothing about the links as they are: no finding rather than "full speed ()".
    measured = [
        g
        for g in snapshot.gpus
        if (g.pcie_width_max and g.pcie_width_current) or (g.pcie_gen_max and g.pcie_gen_current)
    ]
    if not measured:
        return []
    links = {
        f"GPU{g.index}": f"Gen {g.pcie_gen_current}/{g.pcie_gen_max} "
        f"x{g.pcie_width_current}/x{g.pcie_width_max}"
        for g in measured
    }
    data = {"links": links, "source": SOURCE}
    narrow = _narrow_links(measured)
    if narrow:
        return [
            Finding(
                "pcie-links",
                "warn",
                f"PCIe links narrower than the card and slot allow: {', '.join(narrow)}; "
                "decode on this host will be slower than figures measured at full width",
                "reseat the card or move it to a full x16 slot; check the BIOS lane split "
                "(bifurcation) and any riser",
                failure="F34",
                data=data,
            )
        ]
    slow = _slow_links(measured)
    if slow:
        return [
            Finding(
                "pcie-links",
                "info",
                f"PCIe links below their top speed now: {', '.join(slow)}; an idle GPU lowers "
                "its link speed to save power, so this is normal unless it stays during a "
                "request",
                "read it again while a request runs: nvidia-smi --query-gpu=index,"
                "pcie.link.gen.current,pcie.link.gen.max --format=csv",
                failure="F34",
                data=data,
            )
        ]
    widths = sorted({f"x{g.pcie_width_current}" for g in measured if g.pcie_width_current})
    gens = sorted({f"Gen {g.pcie_gen_current}" for g in measured if g.pcie_gen_current})
    return [
        Finding(
            "pcie-links",
            "ok",
            f"PCIe links at full width and speed ({', '.join(gens + widths)})",
            data=data,
        )
    ]


def check_pcie_switch(snapshot: Snapshot | None, needs: Needs) -> list[Finding]:
    """Whether a PCIe switch sits between the GPUs (topo -m PIX/PXB) or each GPU hangs off a
    CPU root port: published figures transfer only between hosts of the same topology, and
    neither is better in general, so this is context, not a warning."""
    if snapshot is None or snapshot.topology is None or len(snapshot.topology.links) == 0:
        return []
    if needs.gpus is not None and needs.gpus <= 1 and needs.tensor_parallel <= 1:
        return []
    links = snapshot.topology.links
    behind_switch = sorted(pair for pair, label in links.items() if label in SWITCH_LABELS)
    data = {"links": dict(links), "source": SOURCE, "switch": bool(behind_switch)}
    if behind_switch:
        shown = ", ".join(f"{pair} {links[pair]}" for pair in behind_switch[:6])
        more = f" and {len(behind_switch) - 6} more" if len(behind_switch) > 6 else ""
        message = (
            f"a PCIe switch sits between GPUs ({shown}{more}): the same image and checkpoint "
            "decoded at 39.6 tok/s on one such host (EPYC 9565, PEX89144) against ~88 on the "
            f"publisher's ({SOURCE}); figures transfer only between hosts built alike"
        )
    elif all(label in ROOT_PORT_LABELS for label in links.values()):
        message = (
            "no PCIe switch between the GPUs: each hangs off a CPU root port "
            f"({', '.join(sorted(set(links.values())))}); figures measured behind a PCIe "
            "switch (the rtx6kpro pages say theirs were) need a measurement on this topology"
        )
    else:
        return []
    return [
        Finding(
            "pcie-switch",
            "info",
            message,
            "before blaming the recipe, compare this host with the source's (CPU, PCIe "
            "switch, 'nvidia-smi topo -m') and measure with 'sm120 bench'",
            failure="F34",
            data=data,
        )
    ]
