"""Captured outputs -> one Snapshot: find each `nvidia-smi` output in a pasted text (a bug
report often holds several, mixed with prose and shell prompts) and merge what they say.

Recognised: the default table, `--query-gpu` / `--query-compute-apps` CSV (with or without
header and units), `topo -m` matrices with their legends, `topo -p2p` matrices,
`nvidia-smi -q` GPU blocks (name, bus id, PCIe link) and `nvidia-smi -L` lines.
"""

from __future__ import annotations

import re
from pathlib import Path

from sm120.core.bounded import MIB, InputTooLarge, read_capped
from sm120.core.errors import SM120Error
from sm120.doctor.nvsmi_parse import (
    CsvResult,
    TableResult,
    headerless_shape,
    is_csv_header,
    parse_banner,
    parse_query_csv,
    parse_table,
)
from sm120.doctor.pcie import QUERY_GPU_HEADER, parse_query_block
from sm120.doctor.snapshot import GpuInfo, GpuProcess, Snapshot
from sm120.doctor.topology import header_devices, parse_p2p, parse_topology

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Markdown quotes ("> ") and list-free prompts are stripped; the outputs themselves are not.
_QUOTE = re.compile(r"^\s*>\s?")
_LIST_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")
# A pasted command names the columns of a header-less CSV printed under it.
_QUERY_COMMAND = re.compile(r"--query-(?:gpu|compute-apps)=([\w.,]+)")
MAX_FILE_BYTES = 5 * MIB
MAX_TOTAL_BYTES = 20 * MIB
MAX_FILES = 1000
_HINT = "pass the text nvidia-smi printed (a few KB), not a log or an archive"


def clean(text: str) -> list[str]:
    lines = []
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = _ANSI.sub("", raw).replace("\u00a0", " ")
        lines.append(_QUOTE.sub("", line).rstrip())
    return lines


def _is_table_line(line: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(("|", "+-", "+=")) and (stripped.endswith(("|", "+")))


def _table_end(lines: list[str], start: int) -> int:
    """Index after a table run; one blank line between the GPU and process tables is kept."""
    end = start
    while end < len(lines):
        if _is_table_line(lines[end]) or (
            not lines[end].strip() and end + 1 < len(lines) and _is_table_line(lines[end + 1])
        ):
            end += 1
        else:
            break
    return end


def _legend_end(lines: list[str], start: int) -> int:
    """Matrices are followed by a Legend (and NIC Legend) block: take it along."""
    end = start
    while end < len(lines):
        stripped = lines[end].strip()
        in_legend = (
            not stripped
            or stripped.startswith(("Legend", "NIC Legend"))
            or re.match(
                r"^(X|NV#|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|OK|CNS|GNS|TNS|NS|DR|U|NP)\s+=", stripped
            )
            or re.match(r"^NIC\d+\s*:", stripped)
        )
        if not in_legend:
            break
        end += 1
    return end


class _Collector:
    def __init__(self) -> None:
        self.snapshot = Snapshot(source="captured")
        self.by_index: dict[int, GpuInfo] = {}
        self.query_gpus = 0  # `nvidia-smi -q` lists GPUs in index order

    def kind(self, name: str) -> None:
        if name not in self.snapshot.kinds:
            self.snapshot.kinds.append(name)

    def gpu(self, info: GpuInfo) -> None:
        index = info.index if info.index is not None else len(self.by_index)
        info.index = index
        existing = self.by_index.get(index)
        if existing is None:
            self.by_index[index] = info
        else:
            existing.merge(info)

    def versions(self, driver: str | None, cuda: str | None) -> None:
        snap = self.snapshot
        snap.driver_version = snap.driver_version or driver
        snap.cuda_version = snap.cuda_version or cuda

    def table(self, result: TableResult) -> None:
        banner = result.banner
        if not (
            result.gpus
            or result.mig_devices
            or result.processes_listed is not None
            or banner.driver_version
            or banner.cuda_version
        ):
            # Any box-drawn table looks like one: only what nvidia-smi prints counts.
            self.snapshot.notes.append("a box table that is not nvidia-smi output was skipped")
            return
        self.kind("table")
        self.versions(result.banner.driver_version, result.banner.cuda_version)
        for gpu in result.gpus:
            self.gpu(gpu)
        self._processes(result.processes)
        if result.processes_listed is not None:
            listed = self.snapshot.processes_listed
            self.snapshot.processes_listed = bool(listed) or result.processes_listed
        self.snapshot.mig_devices.extend(result.mig_devices)

    def csv(self, result: CsvResult) -> None:
        if result.apps:
            self.kind("csv-apps")
            self._processes(result.processes)
            self.snapshot.processes_listed = bool(self.snapshot.processes_listed) or bool(
                result.processes
            )
        if result.gpus:
            self.kind("csv-gpus")
        self.versions(result.driver_version, None)
        for gpu in result.gpus:
            self.gpu(gpu)
        self.snapshot.notes.extend(n for n in result.notes if n not in self.snapshot.notes)

    def _processes(self, processes: list[GpuProcess]) -> None:
        seen = {(p.gpu, p.pid, p.gpu_uuid) for p in self.snapshot.processes}
        for proc in processes:
            if (proc.gpu, proc.pid, proc.gpu_uuid) not in seen:
                self.snapshot.processes.append(proc)

    def finish(self) -> Snapshot:
        snap = self.snapshot
        snap.gpus = [self.by_index[i] for i in sorted(self.by_index)]
        by_uuid = {g.uuid: g.index for g in snap.gpus if g.uuid}
        for proc in snap.processes:
            if proc.gpu is None and proc.gpu_uuid in by_uuid:
                proc.gpu = by_uuid[proc.gpu_uuid]
        snap.processes = dedupe_processes(snap.processes)
        return snap


def dedupe_processes(processes: list[GpuProcess]) -> list[GpuProcess]:
    """The table and the compute-apps query list the same compute processes: keep one,
    with the best of what each said (a name not cut from the left, the memory)."""
    unique: dict[tuple[int | None, int | None], GpuProcess] = {}
    for proc in processes:
        key = (proc.gpu, proc.pid)
        kept = unique.get(key)
        if kept is None or proc.pid is None:
            unique[key if proc.pid is not None else (proc.gpu, -len(unique))] = proc
            continue
        if proc.name and (
            kept.name is None or (kept.name.startswith("...") and not proc.name.startswith("..."))
        ):
            kept.name = proc.name
        kept.used_mib = kept.used_mib if kept.used_mib is not None else proc.used_mib
        kept.type = kept.type or proc.type
        kept.gpu_uuid = kept.gpu_uuid or proc.gpu_uuid
    return list(unique.values())


def parse_text(text: str) -> Snapshot:
    """Everything recognisable in one text, merged."""
    collector = _Collector()
    _scan(clean(text), collector)
    return collector.finish()


def _scan(lines: list[str], out: _Collector) -> None:
    i = 0
    fields: list[str] | None = None  # from the last pasted --query-... command
    while i < len(lines):
        line = lines[i]
        if command := _QUERY_COMMAND.search(line):
            fields = command.group(1).strip(",").split(",")
            i += 1
        elif (
            fields
            and "," in line
            and len(_split(line)) == len(fields)
            and not (is_csv_header(line))
        ):
            i = _csv(lines, i, out, fields)
            fields = None
        elif _is_table_line(line):
            end = _table_end(lines, i)
            out.table(parse_table("\n".join(lines[i:end])))
            i = end
        elif header_devices(line) is not None:
            i = _matrix(lines, i, out)
        elif "," in line and (is_csv_header(line) or headerless_shape(_split(line))):
            i = _csv(lines, i, out)
        elif QUERY_GPU_HEADER.match(line.strip()):
            gpu, i = parse_query_block(lines, i)
            gpu.index = out.query_gpus
            out.query_gpus += 1
            out.kind("query")
            out.gpu(gpu)
        elif match := _LIST_LINE.match(line.strip()):
            out.kind("list")
            out.gpu(GpuInfo(index=int(match.group(1)), name=match.group(2), uuid=match.group(3)))
            i += 1
        else:
            banner = parse_banner(line) if "Version" in line else None
            if banner and (banner.driver_version or banner.cuda_version):
                out.versions(banner.driver_version, banner.cuda_version)
            i += 1


def _split(line: str) -> list[str]:
    return [cell.strip() for cell in line.split(",")]


def _matrix(lines: list[str], start: int, out: _Collector) -> int:
    header = lines[start]
    end = start + 1
    while end < len(lines) and (lines[end].split()[:1] or [""])[0].startswith(
        ("GPU", "NIC", "mlx")
    ):
        end += 1
    legend_end = _legend_end(lines, end)
    body, legend = lines[start + 1 : end], lines[end:legend_end]
    p2p = parse_p2p(header, body)
    if p2p is not None:
        out.kind("p2p")
        out.snapshot.p2p = p2p
        return legend_end
    topo = parse_topology(header, body, legend)
    if topo is None:
        out.snapshot.notes.append(f"a matrix that is not a topo -m output was skipped: {header}")
        return end
    out.kind("topology")
    out.snapshot.topology = topo
    return legend_end


def _csv(lines: list[str], start: int, out: _Collector, fields: list[str] | None = None) -> int:
    end = start + 1
    width = len(_split(lines[start]))
    while end < len(lines) and "," in lines[end] and len(_split(lines[end])) == width:
        end += 1
    out.csv(parse_query_csv("\n".join(lines[start:end]), fields))
    return end


def read_captured(path: Path) -> tuple[Snapshot, list[Path]]:
    """A file, or every file in a folder (sorted), as one machine's outputs.

    A pipe or device is read like a file (`--from <(ssh gpu-box nvidia-smi)` works), and
    every read is bounded by the bytes it returned: devices report a size of 0."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())[: MAX_FILES + 1]
        if len(files) > MAX_FILES:
            raise InputTooLarge(f"--from: {path} holds more than {MAX_FILES} files", _HINT)
    else:
        files = [path]
    texts = []
    budget = MAX_TOTAL_BYTES
    for item in files:
        data = read_capped(item, min(MAX_FILE_BYTES, budget), "--from:", _HINT)
        budget -= len(data)
        texts.append(data.decode("utf-8", errors="replace"))
    snapshot = parse_text("\n\n".join(texts))
    for gpu in snapshot.gpus:
        _check_gpu_row(gpu, path)
    return snapshot, files


# No GPU holds more than this (the largest today hold under 300 GiB); nvidia-smi's compute
# capabilities run from 1.0 to 12.x.
MAX_GPU_MEMORY_MIB = 1 << 22
MAX_CC_MAJOR = 20


def _check_gpu_row(gpu: GpuInfo, path: Path) -> None:
    """A row no GPU could print is a damaged or made-up capture: verdicts drawn from it
    ("nothing blocks") would be about no machine at all."""
    problem = None
    total, used = gpu.memory_total_mib, gpu.memory_used_mib
    if total is not None and not 0 < total <= MAX_GPU_MEMORY_MIB:
        problem = f"{total:,} MiB of memory"
    elif total is not None and used is not None and used > total:
        problem = f"{used:,} MiB used of {total:,} MiB"
    elif gpu.compute_cap and not _plausible_cc(gpu.compute_cap):
        problem = f"compute capability {gpu.compute_cap[:20]}"
    if problem:
        raise SM120Error(
            f"--from: {path} shows GPU{gpu.index if gpu.index is not None else '?'} with "
            f"{problem}, which no GPU reports",
            _HINT,
        )


def _plausible_cc(cap: str) -> bool:
    major, _, minor = cap.partition(".")
    return major.isdigit() and 1 <= int(major) <= MAX_CC_MAJOR and (not minor or minor.isdigit())
