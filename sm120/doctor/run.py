"""Gather what the checks judge - through injectable doors (a command runner, NVML, file
readers) - run them, and hand back the findings with what they were based on."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sm120.core.errors import SM120Error
from sm120.core.ports import ensure_port_free
from sm120.doctor import checks, host_checks, pcie
from sm120.doctor.capture import read_captured
from sm120.doctor.engine_probe import EngineInfo, probe_engine
from sm120.doctor.findings import Finding, blocking
from sm120.doctor.gpu_source import GpuProbe, probe_gpus
from sm120.doctor.host_checks import DiskUsage, DockerState
from sm120.doctor.kv_tier_checks import check_kv_tier_disk, check_kv_tier_memory
from sm120.doctor.needs import Needs, needs_from_plan
from sm120.doctor.runner import Runner, run_command
from sm120.doctor.snapshot import GpuInfo, Snapshot
from sm120.engine.engine_env import engine_python_in, ready_managed_engine
from sm120.engine.find import runtime_for
from sm120.engine.gpu_readings import load_nvml
from sm120.engine.state import list_states

if TYPE_CHECKING:
    from sm120.plan.resolve import LaunchPlan

SHM_PATH = "/dev/shm"


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _ensure_port_free(host: str, port: int) -> None:
    ensure_port_free(host, port)


def _deployment_on_port(port: int) -> str | None:
    """The running sm120 deployment serving this port, if one does."""
    for state in list_states():
        if state.port == port and runtime_for(state).status(state).running:
            return state.name
    return None


@dataclass
class Machine:
    """Every door to the live machine. Tests replace the ones they need."""

    run: Runner = run_command
    nvml: ModuleType | None = field(default_factory=load_nvml)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    read_text: Callable[[str], str | None] = _read_text
    disk_usage: DiskUsage = shutil.disk_usage
    which: Callable[[str], str | None] = shutil.which
    ensure_port_free: Callable[[str, int], None] = _ensure_port_free
    deployment_on_port: Callable[[int], str | None] = _deployment_on_port


@dataclass
class DoctorResult:
    findings: list[Finding]
    needs: Needs
    gpu: GpuProbe | None = None
    engine: EngineInfo | None = None
    docker: DockerState | None = None
    disk_target: str | None = None

    @property
    def ok(self) -> bool:
        return not blocking(self.findings)

    def document(self) -> dict[str, Any]:
        snapshot = self.gpu.snapshot if self.gpu else None
        return {
            "ok": self.ok,
            "blocking": [f.id for f in blocking(self.findings)],
            "recipe": self.needs.recipe,
            "gpu_status": self.gpu.status if self.gpu else None,
            "nvidia": snapshot.document() if snapshot else None,
            "engine": _engine_document(self.engine),
            "docker": _docker_document(self.docker),
            "findings": [f.as_dict() for f in self.findings],
        }


def _engine_document(engine: EngineInfo | None) -> dict[str, Any] | None:
    if engine is None:
        return None
    return {
        "python": engine.python,
        "python_version": engine.python_version,
        "torch": engine.torch_version,
        "torch_cuda": engine.torch_cuda,
        "packages": dict(engine.packages),
        "error": engine.error,
    }


def _docker_document(state: DockerState | None) -> dict[str, Any] | None:
    if state is None:
        return None
    info = state.info or {}
    return {
        "reachable": state.reachable,
        "server_version": info.get("ServerVersion"),
        "runtimes": sorted(info.get("Runtimes") or {}),
        "default_runtime": info.get("DefaultRuntime"),
        "detail": state.detail or None,
    }


def _add_commands(probe: GpuProbe, read_text: Callable[[str], str | None]) -> None:
    """nvidia-smi cuts process names; /proc has the whole command line (when visible)."""
    if probe.snapshot is None:
        return
    for proc in probe.snapshot.processes:
        if proc.pid is None:
            continue
        raw = read_text(f"/proc/{proc.pid}/cmdline")
        if raw:
            proc.command = raw.replace("\x00", " ").strip()[:300]


def engine_python_for(explicit: str | None, environ: Mapping[str, str]) -> str | None:
    """--vllm-python, $VLLM_PYTHON, or the managed engine when it is ready; never installs."""
    if explicit:
        return explicit
    if environ.get("VLLM_PYTHON"):
        return environ["VLLM_PYTHON"]

    managed = ready_managed_engine()
    return str(engine_python_in(managed)) if managed is not None else None


def weights_target(needs: Needs, environ: Mapping[str, str]) -> tuple[Path, str]:
    """Where the weights go: the model dir, else the Hugging Face cache."""
    if needs.model_dir:
        return Path(needs.model_dir), "model dir"
    cache = environ.get("HF_HUB_CACHE") or (
        str(Path(environ["HF_HOME"]) / "hub") if environ.get("HF_HOME") else None
    )
    return Path(cache or Path.home() / ".cache" / "huggingface" / "hub"), "Hugging Face cache"


def present_bytes(path: Path) -> int:
    if not path.is_dir():
        return 0
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file():
                total += item.stat().st_size
        except OSError:
            continue
    return total


def run_doctor(
    needs: Needs | None = None,
    *,
    machine: Machine | None = None,
    engine_python: str | None = None,
    check_port: bool = True,
    check_containers: bool = True,
) -> DoctorResult:
    """Every check against the live machine (and the plan's needs, when given)."""
    machine = machine or Machine()
    needs = needs or Needs()
    gpu_needed = needs.gpus is None or needs.gpus > 0
    python = engine_python_for(engine_python, machine.environ)
    # The engine probe (a Python start in the engine's environment) runs beside the GPU probe
    # (NVML or nvidia-smi): both wait on other processes, and a launch waits for both.
    with ThreadPoolExecutor(max_workers=1) as beside:
        engine_probe = beside.submit(probe_engine, python, machine.run) if python else None
        probe = probe_gpus(machine.run, machine.nvml) if gpu_needed else None
        engine = engine_probe.result() if engine_probe is not None else None
    if probe is not None:
        _add_commands(probe, machine.read_text)
    snapshot = probe.snapshot if probe else None
    findings: list[Finding] = []
    if probe is not None:
        findings += checks.check_driver(probe, needs)
        findings += checks.check_cuda_driver(snapshot, needs)
        findings += checks.check_gpus(snapshot, needs)
        findings += checks.check_gpu_memory(snapshot, needs)
        findings += checks.check_gpu_processes(snapshot)
        findings += checks.check_interconnect(snapshot, needs, machine.environ)
        findings += pcie.check_pcie_links(snapshot)
        findings += pcie.check_pcie_switch(snapshot, needs)
    findings += host_checks.check_engine(engine, needs)
    findings += host_checks.check_torch(engine, snapshot, needs)
    docker = None
    if check_containers:
        docker = host_checks.probe_docker(machine.run)
        findings += host_checks.check_docker(docker)
        findings += host_checks.check_container_runtime(docker, machine.which)
    target, label = weights_target(needs, machine.environ)
    findings += host_checks.check_disk(
        target,
        needs,
        present_bytes(target) if needs.weights_gb else 0,
        machine.disk_usage,
        label=label,
    )
    findings += host_checks.check_shm(SHM_PATH, needs, machine.disk_usage)
    if check_port:
        findings += host_checks.check_port(
            needs.host, needs.port, machine.ensure_port_free, machine.deployment_on_port
        )
    meminfo = machine.read_text("/proc/meminfo")
    findings += host_checks.check_system_memory(meminfo)
    findings += check_kv_tier_memory(meminfo, needs)
    findings += check_kv_tier_disk(needs, machine.disk_usage)
    return DoctorResult(findings, needs, probe, engine, docker, str(target))


def preflight(
    plan: LaunchPlan,
    *,
    engine_python: str | None = None,
    machine: Machine | None = None,
    replacing: bool = False,
) -> list[Finding]:
    """The checks a launch of this plan needs, before anything starts. Blocking findings
    (severity error) mean the launch would fail; warnings are worth printing. The recipe's
    hardware rules (S02, S06) already judged GPU count and arch, with --force, so they are
    not repeated here. `replacing`: a running deployment of the same name is about to be
    stopped (--replace), so the port and GPU memory it holds are not held against the launch."""
    needs = needs_from_plan(plan)
    result = run_doctor(needs, machine=machine, engine_python=engine_python, check_containers=False)
    return [
        f
        for f in result.findings
        if f.id != "gpu-count"
        and not _is_arch_warning(f)
        and not (replacing and _held_by_the_running_server(f))
    ]


def _held_by_the_running_server(finding: Finding) -> bool:
    gpu_memory = finding.id.startswith("gpu") and finding.id.endswith("-memory")
    return gpu_memory or finding.id in ("port", "gpu-processes")


def _is_arch_warning(finding: Finding) -> bool:
    return finding.id.startswith("gpu") and finding.id[3:].isdigit() and finding.severity == "warn"


@dataclass
class CapturedResult:
    snapshot: Snapshot
    files: list[Path]
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not blocking(self.findings)

    def document(self) -> dict[str, Any]:
        return {
            **self.snapshot.document(),
            "files": [str(p) for p in self.files],
            "ok": self.ok,
            "findings": [f.as_dict() for f in self.findings],
        }


def diagnose_captured(path: Path, needs: Needs | None = None) -> CapturedResult:
    """`sm120 doctor --from PATH`: the GPU checks, on outputs captured elsewhere."""
    needs = needs or Needs()
    snapshot, files = read_captured(path)
    if not snapshot.kinds:
        raise SM120Error(
            f"no nvidia-smi output recognised in {path}",
            "paste what 'nvidia-smi', 'nvidia-smi topo -m' or 'nvidia-smi --query-gpu=index,"
            "name,compute_cap,memory.total,memory.used --format=csv' printed",
        )
    findings: list[Finding] = []
    probe = GpuProbe("ok", snapshot)
    if snapshot.gpus or snapshot.driver_version:
        findings += checks.check_driver(probe, needs)
    findings += checks.check_cuda_driver(snapshot, needs)
    findings += checks.check_gpus(snapshot, needs)
    findings += checks.check_gpu_memory(snapshot, needs)
    findings += checks.check_gpu_processes(snapshot)
    findings += _captured_interconnect(snapshot, needs)
    findings += pcie.check_pcie_links(snapshot)
    findings += pcie.check_pcie_switch(snapshot, needs)
    findings += [Finding("captured-note", "info", note) for note in snapshot.notes]
    return CapturedResult(snapshot, files, findings)


def _captured_interconnect(snapshot: Snapshot, needs: Needs) -> list[Finding]:
    if len(snapshot.gpus) < 2 and snapshot.topology is not None:
        # A matrix alone (no table) still tells how many GPUs there are.
        gpus = [d for d in snapshot.topology.devices if d.startswith("GPU")]
        if len(gpus) >= 2:
            stand_in = Snapshot(
                source=snapshot.source,
                gpus=[GpuInfo(index=int(g[3:])) for g in gpus],
                topology=snapshot.topology,
                p2p=snapshot.p2p,
            )
            return checks.check_interconnect(stand_in, needs, {})
    return checks.check_interconnect(snapshot, needs, {})
