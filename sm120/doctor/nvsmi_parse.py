"""Parsers for what `nvidia-smi` prints: the default table and the CSV queries.

They read real outputs as users paste them (see docs/doctor.md and
tests/data/nvidia_smi/), which vary by driver generation and platform: `Driver Version:` or
`KMD Version:`, cut names ("NVIDIA RTX PRO 6000 Blac..."), "Not Supported" memory on GB10,
MIG tables, process names cut from the left, CSV with or without units and headers. Every
field a source does not show stays None. Pure functions over text: no I/O.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field

from sm120.doctor.snapshot import GpuInfo, GpuProcess, MigDevice

# Older drivers print "Driver Version:" / "CUDA Version:", the 610 series "KMD Version:" /
# "CUDA UMD Version:". Any of them may read "N/A" (e.g. FreeBSD's CUDA).
_DRIVER = re.compile(r"(?:Driver|KMD) Version\s*:\s*([0-9][\w.\-]*|N/A)")
_CUDA = re.compile(r"CUDA(?: UMD)? Version\s*:\s*([0-9][\w.]*|N/A|Not Found)")
_SMI_VERSION = re.compile(r"NVIDIA-SMI\s+([0-9][\w.\-]*)")
_MEM_PAIR = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_POWER = re.compile(r"(?:\d+|N/A)\s*W?\s*/\s*(\d+(?:\.\d+)?)\s*W")
_BUS_ID = re.compile(r"\b([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\b")
_GPU_FIRST_CELL = re.compile(r"^\s*(\d+)\s+(.*?)\s*(?:\b(On|Off|WDDM|TCC|MCDM|N/A))?\s*$")
_PROC_TYPES = r"(C\+G|M\+C|C|G|M)"
_PROC_NEW = re.compile(
    rf"^\s*(\d+|N/A)\s+(\S+)\s+(\S+)\s+(\d+|N/A)\s+{_PROC_TYPES}\s+(.*?)\s+(\d+\s*MiB|N/A)\s*$"
)
_PROC_OLD = re.compile(rf"^\s*(\d+|N/A)\s+(\d+|N/A)\s+{_PROC_TYPES}\s+(.*?)\s+(\d+\s*MiB|N/A)\s*$")
_MIG_ROW = re.compile(r"^\s*(\d+)\s+(\d+|N/A)\s+(\d+|N/A)\s+(\d+|N/A)\s*$")
_UNKNOWN = {
    "",
    "N/A",
    "[N/A]",
    "Not Supported",
    "[Not Supported]",
    "Not Found",
    "[Not Found]",
    "[Insufficient Permissions]",
    "[Unknown Error]",
    "ERR!",
}


def known(value: str | None) -> str | None:
    """The value, or None when nvidia-smi says it does not know it."""
    if value is None:
        return None
    value = value.strip()
    return None if value in _UNKNOWN else value


def _int(text: str | None) -> int | None:
    value = known(text)
    if value is None:
        return None
    match = re.match(r"^(\d+)(?:\.\d+)?\s*(?:MiB)?$", value)
    return int(match.group(1)) if match else None


def _float(text: str | None) -> float | None:
    value = known(text)
    if value is None:
        return None
    match = re.match(r"^(\d+(?:\.\d+)?)\s*W?$", value)
    return float(match.group(1)) if match else None


# --- the banner --------------------------------------------------------------------------


@dataclass
class Banner:
    smi_version: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None


def parse_banner(text: str) -> Banner:
    banner = Banner()
    if match := _SMI_VERSION.search(text):
        banner.smi_version = match.group(1)
    if match := _DRIVER.search(text):
        banner.driver_version = known(match.group(1))
    if match := _CUDA.search(text):
        banner.cuda_version = known(match.group(1))
    return banner


# --- the default table -------------------------------------------------------------------


@dataclass
class TableResult:
    banner: Banner = field(default_factory=Banner)
    gpus: list[GpuInfo] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    processes_listed: bool | None = None
    mig_devices: list[MigDevice] = field(default_factory=list)


def _cells(line: str) -> list[str]:
    return [cell for cell in line.strip().strip("|").split("|")]


def _is_rule(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and set(stripped) <= set("+-=|")


def _sections(lines: list[str]) -> list[tuple[list[str], list[str]]]:
    """Split a table into (header lines, body lines) pairs at its `|===|` rules."""
    sections: list[tuple[list[str], list[str]]] = []
    header: list[str] = []
    body: list[str] | None = None
    for line in lines:
        if "===" in line and _is_rule(line):
            body = []
            sections.append((header, body))
            header = []
        elif (
            body is not None
            and line.strip().startswith(("+", "|"))
            and "---" in line
            and (_is_rule(line))
        ):
            body.append("")  # a block separator inside a section
        elif body is not None and not line.strip():
            body = None  # a blank line ends the section; the next header starts
        elif body is not None and _looks_like_header(line):
            header = [line]
            body = None
        elif body is not None:
            body.append(line)
        else:
            header.append(line)
    return sections


def _looks_like_header(line: str) -> bool:
    return any(word in line for word in ("Processes:", "MIG devices:", "Persistence-M"))


def parse_table(text: str) -> TableResult:
    """The default `nvidia-smi` output (banner, GPU blocks, MIG devices, processes)."""
    lines = text.splitlines()
    result = TableResult(banner=parse_banner(text))
    for header, body in _sections(lines):
        head = " ".join(header)
        if "Processes" in head:
            _parse_processes(body, "GI" in head, result)
        elif "MIG devices" in head or re.search(r"\bGI\b.*\bCI\b.*\bMIG\b", head):
            _parse_mig(body, result)
        elif "Bus-Id" in head or "Memory-Usage" in head:
            _parse_gpu_blocks(body, result)
    return result


def _blocks(body: list[str]) -> list[list[str]]:
    blocks: list[list[str]] = [[]]
    for line in body:
        if line == "":
            blocks.append([])
        else:
            blocks[-1].append(line)
    return [b for b in blocks if b]


def _parse_gpu_blocks(body: list[str], result: TableResult) -> None:
    for block in _blocks(body):
        first = _cells(block[0])
        match = _GPU_FIRST_CELL.match(first[0])
        if not match:
            continue
        name = match.group(2).strip()
        gpu = GpuInfo(index=int(match.group(1)))
        if name:
            gpu.name_truncated = name.endswith("...")
            gpu.name = name
        if len(first) > 1 and (bus := _BUS_ID.search(first[1])):
            gpu.bus_id = bus.group(1)
        if len(block) > 1:
            _parse_gpu_second_line(_cells(block[1]), gpu)
        if len(block) > 2:
            third = _cells(block[2])
            mig = known(third[-1]) if third else None
            if mig in ("Enabled", "Disabled"):
                gpu.mig = mig == "Enabled"
        result.gpus.append(gpu)


def _parse_gpu_second_line(cells: list[str], gpu: GpuInfo) -> None:
    if power := _POWER.search(cells[0]):
        gpu.power_limit_w = float(power.group(1))
    memory_cell = cells[1] if len(cells) > 1 else ""
    if pair := _MEM_PAIR.search(memory_cell):
        gpu.memory_used_mib, gpu.memory_total_mib = int(pair.group(1)), int(pair.group(2))
        gpu.memory_free_mib = gpu.memory_total_mib - gpu.memory_used_mib
    elif "Not Supported" in memory_cell or "N/A" in memory_cell:
        gpu.memory_reported = False


def _parse_processes(body: list[str], with_instances: bool, result: TableResult) -> None:
    listed = False
    for line in body:
        inner = line.strip().strip("|")
        if "No running processes found" in inner:
            result.processes_listed = False
            return
        if with_instances:
            new = _PROC_NEW.match(inner)
            if new:
                gpu, _gi, _ci, pid, kind, name, used = new.groups()
                result.processes.append(_process(gpu, pid, kind, name, used))
                listed = True
                continue
        old = _PROC_OLD.match(inner)
        if old:
            gpu, pid, kind, name, used = old.groups()
            result.processes.append(_process(gpu, pid, kind, name, used))
            listed = True
    # A process block with rows but none recognised says nothing about processes.
    result.processes_listed = True if listed else result.processes_listed


def _process(gpu: str, pid: str, kind: str, name: str, used: str) -> GpuProcess:
    return GpuProcess(
        gpu=_int(gpu),
        pid=_int(pid),
        name=known(name),
        used_mib=_int(used.replace(" ", "")),
        type=kind,
    )


def _parse_mig(body: list[str], result: TableResult) -> None:
    for block in _blocks(body):
        cells = _cells(block[0])
        ids = _MIG_ROW.match(cells[0]) if cells else None
        if not ids or len(cells) < 2:
            continue
        pair = _MEM_PAIR.search(cells[1])
        result.mig_devices.append(
            MigDevice(
                gpu=int(ids.group(1)),
                gi=_int(ids.group(2)),
                ci=_int(ids.group(3)),
                mig_dev=_int(ids.group(4)),
                memory_used_mib=int(pair.group(1)) if pair else None,
                memory_total_mib=int(pair.group(2)) if pair else None,
            )
        )


# --- CSV queries -------------------------------------------------------------------------

# Field names of `--query-gpu` / `--query-compute-apps`, as the CSV header prints them (minus
# units), mapped to what they mean here. Both queries' spellings are listed.
GPU_FIELDS = {
    "index": "index",
    "name": "name",
    "gpu_name": "name",
    "compute_cap": "compute_cap",
    "memory.total": "memory_total_mib",
    "memory.used": "memory_used_mib",
    "memory.free": "memory_free_mib",
    "driver_version": "driver_version",
    "pci.bus_id": "bus_id",
    "gpu_bus_id": "bus_id",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "power.limit": "power_limit_w",
    "enforced.power.limit": "power_limit_w",
    "mig.mode.current": "mig",
    "pcie.link.gen.current": "pcie_gen_current",
    "pcie.link.gen.gpucurrent": "pcie_gen_current",
    "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.gen.gpumax": "pcie_gen_max",
    "pcie.link.width.current": "pcie_width_current",
    "pcie.link.width.max": "pcie_width_max",
}
APP_FIELDS = {
    "pid": "pid",
    "process_name": "name",
    "name": "name",
    "used_memory": "used_mib",
    "used_gpu_memory": "used_mib",
    "gpu_uuid": "gpu_uuid",
    "gpu_bus_id": "bus_id",
    "gpu_name": "gpu_name",
}
_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")


def field_key(header_cell: str) -> str:
    """`memory.total [MiB]` -> `memory.total`."""
    return _UNIT.sub("", header_cell.strip()).strip().lower()


_FIELD_NAME = re.compile(r"^[a-z][a-z0-9_.]*$")


def is_csv_header(line: str) -> bool:
    """A query header: every cell a field name, at least two of them ones doctor reads
    (a column it does not use, such as compute_mode, is allowed)."""
    keys = [field_key(cell) for cell in line.split(",")]
    if not all(_FIELD_NAME.match(k) for k in keys):
        return False
    recognised = [k for k in keys if k in GPU_FIELDS or k in APP_FIELDS]
    return len(recognised) >= min(2, len(keys))


def _rows(text: str) -> list[list[str]]:
    reader = csv.reader(text.splitlines(), skipinitialspace=True)
    return [[cell.strip() for cell in row] for row in reader if any(c.strip() for c in row)]


@dataclass
class CsvResult:
    gpus: list[GpuInfo] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    driver_version: str | None = None
    notes: list[str] = field(default_factory=list)
    apps: bool = False  # a --query-compute-apps listing (it may list no process at all)


def parse_query_csv(text: str, fields: list[str] | None = None) -> CsvResult:
    """`nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`, or the compute-apps
    query. `fields` names the columns when the text has no header (sm120's own calls)."""
    rows = _rows(text)
    if rows and is_csv_header(",".join(rows[0])):
        keys, rows = [field_key(cell) for cell in rows[0]], rows[1:]
    elif fields is not None:
        keys = [field_key(name) for name in fields]
    else:
        return _headerless(rows)
    result = CsvResult()
    if "pid" in keys:
        result.apps = True
        for row in rows:
            if len(row) == len(keys):
                result.processes.append(_app_row(dict(zip(keys, row, strict=True))))
        return result
    for position, row in enumerate(rows):
        if len(row) != len(keys):
            continue
        gpu, driver = _gpu_row(dict(zip(keys, row, strict=True)), position)
        result.gpus.append(gpu)
        result.driver_version = result.driver_version or driver
    return result


def _gpu_row(values: dict[str, str], position: int) -> tuple[GpuInfo, str | None]:
    gpu = GpuInfo()
    for key, raw in values.items():
        target = GPU_FIELDS.get(key)
        if target is None:
            continue
        if target in ("memory_total_mib", "memory_used_mib", "memory_free_mib"):
            setattr(gpu, target, _int(raw))
            if known(raw) is None:
                gpu.memory_reported = False
        elif target == "power_limit_w":
            gpu.power_limit_w = _float(raw)
        elif target == "index" or target.startswith("pcie_"):
            setattr(gpu, target, _int(raw))
        elif target == "mig":
            mode = known(raw)
            gpu.mig = None if mode is None else mode == "Enabled"
        elif target != "driver_version":
            setattr(gpu, target, known(raw))
    if gpu.index is None:
        gpu.index = position  # nvidia-smi lists GPUs in index order
    if (
        gpu.memory_free_mib is None
        and gpu.memory_total_mib is not None
        and gpu.memory_used_mib is not None
    ):
        gpu.memory_free_mib = gpu.memory_total_mib - gpu.memory_used_mib
    return gpu, known(values.get("driver_version"))


def _app_row(values: dict[str, str]) -> GpuProcess:
    mapped = {APP_FIELDS[k]: v for k, v in values.items() if k in APP_FIELDS}
    return GpuProcess(
        gpu=None,
        pid=_int(mapped.get("pid")),
        name=known(mapped.get("name")),
        used_mib=_int(mapped.get("used_mib")),
        gpu_uuid=known(mapped.get("gpu_uuid")),
    )


# Without a header only values with an unmistakable shape are used.
_CAP = re.compile(r"^(\d{1,2})\.(\d)$")
_DRIVER_SHAPE = re.compile(r"^\d{3}\.\d+(?:\.\d+)?$")


def headerless_shape(row: list[str]) -> str | None:
    """'gpus' or 'apps' when a header-less CSV row can be read with confidence."""
    if len(row) >= 2 and any(_CAP.match(cell) for cell in row):
        names = [c for c in row if re.search(r"[A-Za-z]{2}", c) and not c.startswith("GPU-")]
        if names:
            return "gpus"
    if len(row) == 4 and row[0].startswith(("GPU-", "0000", "MIG-")) and row[1].isdigit():
        return "apps"
    return None


def _headerless(rows: list[list[str]]) -> CsvResult:
    result = CsvResult()
    for position, row in enumerate(rows):
        shape = headerless_shape(row)
        if shape == "gpus":
            gpu = GpuInfo(index=position)
            for cell in row:
                if _CAP.match(cell) and gpu.compute_cap is None:
                    gpu.compute_cap = cell
                elif _DRIVER_SHAPE.match(cell):
                    result.driver_version = cell
                elif cell.startswith("GPU-"):
                    gpu.uuid = cell
                elif _BUS_ID.fullmatch(cell):
                    gpu.bus_id = cell
                elif gpu.name is None and re.search(r"[A-Za-z]{2}", cell):
                    gpu.name = cell
            result.gpus.append(gpu)
        elif shape == "apps":
            result.apps = True
            uuid, pid, name, used = row
            result.processes.append(
                GpuProcess(
                    gpu=None,
                    pid=int(pid),
                    name=known(name),
                    used_mib=_int(used),
                    gpu_uuid=known(uuid) if uuid.startswith("GPU-") else None,
                )
            )
    if rows and (result.gpus or result.processes):
        result.notes.append(
            "a CSV without its header line: only names, compute capabilities, driver "
            "versions and process rows were read (add --format=csv to keep the header)"
        )
    return result
