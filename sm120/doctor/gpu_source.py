"""The live machine's GPUs: NVML (nvidia-ml-py) when it is installed and loads, else the
`nvidia-smi` outputs - parsed by the same code that reads pasted bug reports."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from sm120.doctor.capture import parse_text
from sm120.doctor.runner import Runner
from sm120.doctor.snapshot import GpuInfo, GpuProcess, Snapshot, Topology
from sm120.doctor.topology import pair_key

QUERY_FIELDS = (
    "index,name,compute_cap,memory.total,memory.used,memory.free,driver_version,"
    "pci.bus_id,uuid,power.limit,mig.mode.current,"
    "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
)
APPS_FIELDS = "gpu_uuid,pid,process_name,used_memory"
# nvmlDeviceGetTopologyCommonAncestor levels, in `topo -m` words.
NVML_TOPOLOGY = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
NVML_MAX_LINKS = 18
MIB = 1024 * 1024

Status = Literal["ok", "no-driver", "driver-error"]


@dataclass
class GpuProbe:
    status: Status
    snapshot: Snapshot | None = None
    detail: str = ""  # what the failing tool said

    @property
    def gpus(self) -> list[GpuInfo]:
        return self.snapshot.gpus if self.snapshot else []


def probe_gpus(run: Runner, nvml: ModuleType | None = None) -> GpuProbe:
    if nvml is not None:
        probe = probe_with_nvml(nvml, run)
        if probe is not None:
            return probe
    return probe_with_nvidia_smi(run)


# --- nvidia-smi ------------------------------------------------------------------------


def probe_with_nvidia_smi(run: Runner) -> GpuProbe:
    query = run(["nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv,nounits"])
    if query.missing:
        return GpuProbe("no-driver", detail="nvidia-smi is not on PATH")
    if not query.ok and "not a valid field" in query.text():
        # Drivers older than 510 do not know compute_cap (and some other fields).
        fields = "index,name,memory.total,memory.used,memory.free,driver_version,pci.bus_id,uuid"
        query = run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,nounits"])
    if not query.ok:
        return GpuProbe("driver-error", detail=_first_line(query.text()) or "nvidia-smi failed")
    outputs = [query.stdout]
    table = run(["nvidia-smi"])
    if table.ok:
        outputs.append(table.stdout)  # the only place the CUDA version is printed
    apps = run(["nvidia-smi", f"--query-compute-apps={APPS_FIELDS}", "--format=csv,nounits"])
    if apps.ok:
        outputs.append(apps.stdout)
    snapshot = parse_text("\n\n".join(outputs))
    if len(snapshot.gpus) > 1:
        _add_topology(run, snapshot)
    snapshot.source = "nvidia-smi"
    return GpuProbe("ok", snapshot)


def _add_topology(run: Runner, snapshot: Snapshot) -> None:
    extra = []
    for argv in (["nvidia-smi", "topo", "-m"], ["nvidia-smi", "topo", "-p2p", "r"]):
        result = run(argv)
        if result.ok:
            extra.append(result.stdout)
    if extra:
        more = parse_text("\n\n".join(extra))
        snapshot.topology = more.topology
        snapshot.p2p = more.p2p
        snapshot.kinds.extend(k for k in more.kinds if k not in snapshot.kinds)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


# --- NVML ------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_with_nvml(nvml: ModuleType, run: Runner) -> GpuProbe | None:
    """None when NVML cannot load the driver library: nvidia-smi then has the last word."""
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded / ...: let nvidia-smi say
        return None
    try:
        snapshot = _nvml_snapshot(nvml)
    except Exception as exc:  # a driver that loads but cannot answer is a broken driver
        return GpuProbe("driver-error", detail=f"NVML: {exc}")
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    if len(snapshot.gpus) > 1:
        _add_topology(run, snapshot)
    return GpuProbe("ok", snapshot)


def _nvml_snapshot(nvml: ModuleType) -> Snapshot:
    snapshot = Snapshot(source="nvml", kinds=["nvml"])
    snapshot.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
    with contextlib.suppress(Exception):
        version = int(nvml.nvmlSystemGetCudaDriverVersion())
        snapshot.cuda_version = f"{version // 1000}.{(version % 1000) // 10}"
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    for index, handle in enumerate(handles):
        snapshot.gpus.append(_nvml_gpu(nvml, index, handle))
        snapshot.processes.extend(_nvml_processes(nvml, index, handle))
    snapshot.processes_listed = bool(snapshot.processes)
    if len(handles) > 1:
        snapshot.topology = _nvml_topology(nvml, handles, snapshot.gpus)
    return snapshot


def _nvml_gpu(nvml: ModuleType, index: int, handle: Any) -> GpuInfo:
    gpu = GpuInfo(index=index, name=_text(nvml.nvmlDeviceGetName(handle)))
    with contextlib.suppress(Exception):
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        gpu.compute_cap = f"{major}.{minor}"
    try:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        gpu.memory_total_mib = int(memory.total) // MIB
        gpu.memory_used_mib = int(memory.used) // MIB
        gpu.memory_free_mib = int(memory.free) // MIB
    except Exception:  # GB10: unified memory is "Not Supported"
        gpu.memory_reported = False
    with contextlib.suppress(Exception):
        gpu.bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    with contextlib.suppress(Exception):
        gpu.uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    with contextlib.suppress(Exception):
        gpu.power_limit_w = int(nvml.nvmlDeviceGetEnforcedPowerLimit(handle)) / 1000
    with contextlib.suppress(Exception):
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        gpu.mig = bool(current)
    for field_name, getter in (
        ("pcie_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
        ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
        ("pcie_width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
        ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
    ):
        with contextlib.suppress(Exception):
            setattr(gpu, field_name, int(getattr(nvml, getter)(handle)))
    return gpu


def _nvml_processes(nvml: ModuleType, index: int, handle: Any) -> list[GpuProcess]:
    found: dict[int, GpuProcess] = {}
    for getter, kind in (
        ("nvmlDeviceGetComputeRunningProcesses", "C"),
        ("nvmlDeviceGetGraphicsRunningProcesses", "G"),
    ):
        try:
            infos = getattr(nvml, getter)(handle)
        except Exception:
            continue
        for info in infos:
            used = getattr(info, "usedGpuMemory", None)
            if info.pid in found:
                found[info.pid].type = "C+G"
                continue
            found[info.pid] = GpuProcess(
                gpu=index,
                pid=int(info.pid),
                name=_process_name(nvml, int(info.pid)),
                used_mib=int(used) // MIB if isinstance(used, int) else None,
                type=kind,
            )
    return list(found.values())


def _process_name(nvml: ModuleType, pid: int) -> str | None:
    try:
        return _text(nvml.nvmlSystemGetProcessName(pid))
    except Exception:
        comm = Path(f"/proc/{pid}/comm")
        return comm.read_text().strip() if comm.is_file() else None


def _nvml_topology(nvml: ModuleType, handles: list[Any], gpus: list[GpuInfo]) -> Topology:
    topo = Topology(devices=[f"GPU{i}" for i in range(len(handles))])
    bus_to_index = {(g.bus_id or "").lower(): g.index for g in gpus}
    nvlinks = _nvml_nvlink_counts(nvml, handles, bus_to_index)
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            key = pair_key(f"GPU{i}", f"GPU{j}")
            if nvlinks.get((i, j)):
                topo.links[key] = f"NV{nvlinks[(i, j)]}"
                continue
            with contextlib.suppress(Exception):
                level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
                topo.links[key] = NVML_TOPOLOGY.get(level, "SYS")
    return topo


def _nvml_nvlink_counts(
    nvml: ModuleType, handles: list[Any], bus_to_index: dict[str, int | None]
) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for i, handle in enumerate(handles):
        for link in range(NVML_MAX_LINKS):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
                remote = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except Exception:
                break  # no (more) NVLink on this GPU
            j = bus_to_index.get(remote.lower())
            if j is not None and j > i:
                counts[(i, j)] = counts.get((i, j), 0) + 1
    return counts
