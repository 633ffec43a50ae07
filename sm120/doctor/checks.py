"""The doctor's GPU checks (driver, GPUs, memory holders, interconnect): one function per
question, each taking exactly what it judges (no I/O of its own) and returning its findings.
The machine's other checks are in host_checks; sm120.doctor.run gathers the inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sm120.doctor.engine_probe import version_tuple
from sm120.doctor.findings import Finding, Severity
from sm120.doctor.gpu_names import edition, gpu_arch
from sm120.doctor.gpu_source import GpuProbe
from sm120.doctor.needs import SM12X, Needs
from sm120.doctor.snapshot import GpuInfo, GpuProcess, Snapshot
from sm120.doctor.topology import interconnect
from sm120.plan.gpu_sets import placed_on

MIN_CUDA_SM120 = (12, 8)
BUSY_FRACTION = 0.10  # without a plan, a GPU more than 10% full is worth a warning
HOLDER_MIB = 1024  # processes below 1 GiB (a desktop) are not what blocks a server

NO_DRIVER_FIX = (
    "install the NVIDIA driver (570 or newer for SM120) and check that 'nvidia-smi' works; "
    "without a GPU only the CPU recipe (sm120 launch tiny) runs here"
)


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value:,} MiB"


# --- driver and GPUs ---------------------------------------------------------------------


def check_driver(probe: GpuProbe, needs: Needs) -> list[Finding]:
    if probe.status == "no-driver":
        severity: Severity = "error" if needs.uses_gpus else "warn"
        if needs.gpus == 0:
            severity = "info"  # the CPU recipe does not want one
        want = f"; {needs.recipe} needs {needs.gpus} GPU(s)" if needs.uses_gpus else ""
        return [
            Finding(
                "driver",
                severity,
                f"no NVIDIA GPU found: {probe.detail or 'no driver'}, NVML not available{want}",
                NO_DRIVER_FIX,
                data={"status": probe.status},
            )
        ]
    if probe.status == "driver-error":
        return [
            Finding(
                "driver",
                "error",
                f"the NVIDIA driver does not answer: {probe.detail}",
                "a driver update without a reboot, or a kernel module that did not load: reboot, "
                "then check 'nvidia-smi' and 'dmesg | grep -i nvrm'",
                data={"status": probe.status},
            )
        ]
    snap = probe.snapshot or Snapshot(source="none")
    cuda = f", CUDA {snap.cuda_version}" if snap.cuda_version else ""
    via = {"captured": "the captured output"}.get(snap.source, snap.source)
    return [
        Finding(
            "driver",
            "ok",
            f"NVIDIA driver {snap.driver_version or '(version not shown)'}{cuda} "
            f"({len(snap.gpus)} GPU(s), read from {via})",
            data={"driver_version": snap.driver_version, "cuda_version": snap.cuda_version},
        )
    ]


def is_sm12x(gpu: GpuInfo) -> bool:
    return gpu_arch(gpu.name, gpu.compute_cap)[0] in SM12X


def describe_gpu(gpu: GpuInfo) -> str:
    arch, source = gpu_arch(gpu.name, gpu.compute_cap)
    arch_text = arch or "unknown arch"
    if arch and source == "name":
        arch_text += " (from the name)"
    parts = [f"GPU{gpu.index}: {gpu.name or '(name not shown)'}", arch_text]
    if gpu.memory_total_mib is not None:
        free = gpu.memory_free_mib
        parts.append(f"{_mib(gpu.memory_total_mib)} total, {_mib(free)} free")
    elif not gpu.memory_reported:
        parts.append("unified memory (not reported)")
    if gpu.mig:
        parts.append("MIG enabled")
    if found := edition(gpu.name, gpu.power_limit_w):
        parts.append(f"edition: {found}")
    return ", ".join(parts)


def _not_sm12x(gpu: GpuInfo, arch: str, data: dict[str, Any], needs: Needs) -> Finding:
    """Without a recipe: say what would and what would not run on a GPU that is not SM12x."""
    here = list(needs.targets.get(arch, ()))
    sm12x_only = sorted(
        {t.split()[0] for a in SM12X for t in needs.targets.get(a, ())}
        - {t.split()[0] for t in here}
    )
    runs = f"validated here: {', '.join(here)}" if here else f"no recipe is validated on {arch}"
    refused = (
        f"{', '.join(sm12x_only)} need SM120/SM121 (NVFP4/MXFP4 kernels and SM12x attention "
        "backends) and refuse this GPU unless --force S06"
        if sm12x_only
        else "recipes validated elsewhere refuse this GPU unless --force S06"
    )
    return Finding(
        f"gpu{gpu.index}",
        "warn",
        f"{describe_gpu(gpu)}: not SM120/SM121; {runs}",
        refused,
        data=data,
    )


def check_gpus(snapshot: Snapshot | None, needs: Needs) -> list[Finding]:
    if snapshot is None:
        return []
    findings = []
    wanted = needs.archs if needs.uses_gpus else SM12X
    for gpu in snapshot.gpus:
        arch, source = gpu_arch(gpu.name, gpu.compute_cap)
        data: dict[str, Any] = {"arch": arch, "arch_source": source, **gpu.as_dict()}
        if arch is None:
            findings.append(Finding(f"gpu{gpu.index}", "info", describe_gpu(gpu), "", data=data))
        elif arch in wanted:
            findings.append(Finding(f"gpu{gpu.index}", "ok", describe_gpu(gpu), data=data))
        elif needs.recipe is None:
            findings.append(_not_sm12x(gpu, arch, data, needs))
        else:
            target = needs.recipe
            findings.append(
                Finding(
                    f"gpu{gpu.index}",
                    "warn",
                    f"{describe_gpu(gpu)}: {target} is validated on {', '.join(wanted)}",
                    "expect other kernels and limits; a recipe refuses it unless --force S06",
                    data=data,
                )
            )
        if gpu.mig:
            findings.append(
                Finding(
                    f"gpu{gpu.index}-mig",
                    "warn",
                    f"GPU{gpu.index} has MIG enabled: each instance is a slice of the GPU",
                    "disable MIG for serving a large model: sudo nvidia-smi -i "
                    f"{gpu.index} -mig 0 (then reset the GPU)",
                )
            )
    findings.extend(_gpu_count(snapshot, needs))
    return findings


def _gpu_count(snapshot: Snapshot, needs: Needs) -> list[Finding]:
    if not needs.uses_gpus or needs.gpus is None:
        return []
    have = len(snapshot.gpus)
    if have == 0 or have >= needs.gpus:
        return []  # none listed: the output did not show the GPUs, so no count to judge
    return [
        Finding(
            "gpu-count",
            "error",
            f"{needs.recipe} uses {needs.gpus} GPUs, this machine shows {have}",
            "pick a variant for fewer GPUs (sm120 recipes show NAME) or lower tensor-parallel-size",
        )
    ]


def check_cuda_driver(snapshot: Snapshot | None, needs: Needs) -> list[Finding]:
    """The driver's CUDA version: SM120 kernels need a CUDA 12.8 driver (570 series)."""
    if snapshot is None or not snapshot.gpus:
        return []
    if not any(is_sm12x(g) for g in snapshot.gpus):
        return []
    found = version_tuple(snapshot.cuda_version)
    if found is None:
        return [
            Finding(
                "cuda",
                "info",
                "the driver's CUDA version was not shown; SM120 needs CUDA 12.8 or newer",
                "run plain 'nvidia-smi' and read 'CUDA Version' in its first line",
            )
        ]
    if found < MIN_CUDA_SM120:
        return [
            Finding(
                "cuda",
                "error",
                f"the driver supports CUDA {snapshot.cuda_version}; SM120/SM121 GPUs need 12.8 "
                "or newer",
                "install driver 570 or newer (580+ recommended)",
            )
        ]
    return [Finding("cuda", "ok", f"driver CUDA {snapshot.cuda_version} supports SM120")]


# --- memory and processes (F18) ----------------------------------------------------------


def _holders(snapshot: Snapshot, gpu: int | None) -> list[GpuProcess]:
    return [p for p in snapshot.processes if gpu is None or p.gpu == gpu]


def describe_process(proc: GpuProcess) -> str:
    used = f", {_mib(proc.used_mib)}" if proc.used_mib is not None else ""
    where = f"GPU{proc.gpu}" if proc.gpu is not None else (proc.gpu_uuid or "GPU ?")
    what = proc.command or proc.name or "(name not shown)"
    return f"pid {proc.pid if proc.pid is not None else '?'} on {where}{used}: {what}"


def _holder_text(snapshot: Snapshot, gpu: int | None) -> str:
    holders = [p for p in _holders(snapshot, gpu) if (p.used_mib or 0) >= HOLDER_MIB]
    if holders:
        return "stop what holds it: " + "; ".join(describe_process(p) for p in holders)
    if snapshot.processes_listed is False:
        return (
            "no process is listed: the memory is held outside this view (another container, "
            "or host processes seen from a container) - check with nvidia-smi on the host"
        )
    return "find the holder with 'nvidia-smi' (Processes) and stop it"


def check_gpu_memory(snapshot: Snapshot | None, needs: Needs) -> list[Finding]:
    if snapshot is None:
        return []
    placed = placed_on(needs.env)
    if placed is not None:
        # launch --gpus 0,1: the engine sees these GPUs only, whatever the others hold.
        used_gpus = [gpu for gpu in snapshot.gpus if gpu.index in placed]
    else:
        used_gpus = snapshot.gpus[: needs.gpus] if needs.uses_gpus else snapshot.gpus
    return [_gpu_memory(snapshot, gpu, needs) for gpu in used_gpus]


def _gpu_memory(snapshot: Snapshot, gpu: GpuInfo, needs: Needs) -> Finding:
    ident = f"gpu{gpu.index}-memory"
    total, used = gpu.memory_total_mib, gpu.memory_used_mib
    if total is None or used is None:
        held = sum(p.used_mib or 0 for p in _holders(snapshot, gpu.index))
        return Finding(
            ident,
            "info",
            f"GPU{gpu.index} does not report its memory (unified memory on GB10, or MIG); "
            f"processes hold {held:,} MiB",
            "plan memory against system RAM (free -g) on unified-memory machines",
        )
    free = gpu.memory_free_mib if gpu.memory_free_mib is not None else total - used
    data = {"total_mib": total, "used_mib": used, "free_mib": free}
    if needs.gpu_memory_utilization is not None:
        wanted = int(total * needs.gpu_memory_utilization)
        data["wanted_mib"] = wanted
        if free < wanted:
            return Finding(
                ident,
                "error",
                f"GPU{gpu.index} has {_mib(free)} free of {_mib(total)}; {needs.recipe} asks "
                f"vLLM for {needs.gpu_memory_utilization:.0%} ({_mib(wanted)})",
                _holder_text(snapshot, gpu.index),
                failure="F18",
                data=data,
            )
        return Finding(
            ident,
            "ok",
            f"GPU{gpu.index}: {_mib(free)} free, enough for "
            f"{needs.gpu_memory_utilization:.0%} of {_mib(total)}",
            data=data,
        )
    if used > total * BUSY_FRACTION:
        return Finding(
            ident,
            "warn",
            f"GPU{gpu.index}: {_mib(used)} of {_mib(total)} already in use",
            _holder_text(snapshot, gpu.index),
            failure="F18",
            data=data,
        )
    return Finding(ident, "ok", f"GPU{gpu.index}: {_mib(free)} of {_mib(total)} free", data=data)


def check_gpu_processes(snapshot: Snapshot | None) -> list[Finding]:
    if snapshot is None or not snapshot.gpus:
        return []
    procs = snapshot.processes
    data = {"processes": [p.as_dict() for p in procs]}
    if not procs:
        if snapshot.processes_listed is None:
            return [Finding("gpu-processes", "info", "no process list was available")]
        return [Finding("gpu-processes", "ok", "no process holds GPU memory", data=data)]
    big = [p for p in procs if (p.used_mib or 0) >= HOLDER_MIB]
    listing = "; ".join(describe_process(p) for p in procs)
    if big:
        return [
            Finding(
                "gpu-processes",
                "warn",
                f"{len(big)} process(es) hold 1 GiB or more of GPU memory: {listing}",
                "stop them before launching (a stale server is the usual one: "
                "'sm120 status' / 'sm120 stop')",
                failure="F18",
                data=data,
            )
        ]
    return [Finding("gpu-processes", "info", f"small GPU users only: {listing}", data=data)]


# --- interconnect (F10) ------------------------------------------------------------------


def summarise_links(links: Mapping[str, str]) -> str:
    """A few pairs by name; many by label count ('28 GPU pairs: NV18 x28')."""
    if len(links) <= 4:
        return ", ".join(f"{pair} {label}" for pair, label in sorted(links.items()))
    counts: dict[str, int] = {}
    for label in links.values():
        counts[label] = counts.get(label, 0) + 1
    by_count = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return f"{len(links)} GPU pairs: " + ", ".join(f"{label} x{n}" for label, n in by_count)


def check_interconnect(
    snapshot: Snapshot | None, needs: Needs, environ: Mapping[str, str]
) -> list[Finding]:
    if snapshot is None or len(snapshot.gpus) < 2:
        return []
    if needs.gpus is not None and needs.gpus <= 1 and needs.tensor_parallel <= 1:
        return [Finding("interconnect", "info", f"{needs.recipe} uses one GPU: no GPU traffic")]
    topo = snapshot.topology
    kind = interconnect(topo)
    if topo is None or kind is None:
        return [
            Finding(
                "interconnect",
                "info",
                "GPU interconnect unknown (no 'nvidia-smi topo -m' output)",
                "run 'nvidia-smi topo -m': NV# means NVLink, PIX/PXB/PHB/NODE/SYS mean PCIe",
            )
        ]
    labels = summarise_links(topo.links)
    data = {"interconnect": kind, "links": dict(topo.links), "p2p": snapshot.p2p}
    if kind == "nvlink":
        return [Finding("interconnect", "ok", f"NVLink between all GPUs ({labels})", data=data)]
    p2p_disabled = (needs.env.get("NCCL_P2P_DISABLE") or environ.get("NCCL_P2P_DISABLE")) == "1"
    if kind == "mixed":
        return [
            Finding(
                "interconnect",
                "warn",
                f"NVLink between some GPU pairs only ({labels})",
                "keep tensor-parallel groups inside NVLink-connected GPUs (CUDA_VISIBLE_DEVICES)",
                data=data,
            )
        ]
    if p2p_disabled:
        return [
            Finding(
                "interconnect", "ok", f"PCIe only ({labels}); NCCL_P2P_DISABLE=1 is set", data=data
            )
        ]
    p2p = snapshot.p2p or {}
    gpu_pairs = {k: v for k, v in p2p.items() if k.count("GPU") == 2}
    if gpu_pairs and all(v != "OK" for v in gpu_pairs.values()):
        states = ", ".join(sorted(set(gpu_pairs.values())))
        return [
            Finding(
                "interconnect",
                "info",
                f"PCIe only ({labels}); the driver grants no GPU peer-to-peer ({states}), so NCCL "
                "goes through host memory and cannot take the P2P path that hangs (F10)",
                data=data,
            )
        ]
    said = " the driver reports P2P OK, but" if gpu_pairs else ""
    return [
        Finding(
            "interconnect",
            "warn",
            f"PCIe only ({labels}):{said} NCCL's P2P transport hangs at init on many PCIe "
            "workstations (ACS / IOMMU)",
            "set NCCL_P2P_DISABLE=1 (--set env.NCCL_P2P_DISABLE=1) unless P2P is verified "
            "(nccl-tests all_reduce_perf -g N completes), or disable ACS / IOMMU in the BIOS",
            failure="F10",
            data=data,
        )
    ]
