"""The environment report `vllm collect-env` fails to give on uv-only installs (F28: it shells
out to pip). Built from what doctor already gathered plus a few facts about the system;
package versions come from the engine's own metadata, so no pip is needed.

Plain markdown, meant to be pasted into a bug report. Values of variables whose names look
secret are never written.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from sm120 import __version__
from sm120.core.paths import sm120_home
from sm120.doctor.host_checks import parse_meminfo
from sm120.engine.state import private_dir, write_private_atomically

if TYPE_CHECKING:
    from sm120.doctor.run import DoctorResult, Machine

GIB = 1024**3
REPORT_NAME = "environment.md"
# Variables that change how the engine or NCCL behave; their values go into the report.
_RELEVANT_ENV = re.compile(r"^(CUDA_|NCCL_|VLLM_|TORCH_|HF_|PYTORCH_|NVIDIA_|SM120_|UV_)")
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


@dataclass
class SystemInfo:
    os_name: str | None = None
    kernel: str = ""
    machine: str = ""
    cpu: str | None = None
    cpu_count: int | None = None
    memory_total: int | None = None
    python: str = ""
    environment: dict[str, str] = field(default_factory=dict)


def _os_name(os_release: str | None) -> str | None:
    for line in (os_release or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def _cpu_name(cpuinfo: str | None) -> str | None:
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model name", "Hardware") and value.strip():
            return value.strip()
    return None


def relevant_environment(environ: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name in sorted(environ):
        if not _RELEVANT_ENV.match(name):
            continue
        out[name] = "(set, value hidden)" if _SECRET.search(name) else environ[name]
    return out


def collect_system(machine: Machine) -> SystemInfo:
    meminfo = parse_meminfo(machine.read_text("/proc/meminfo") or "")
    return SystemInfo(
        os_name=_os_name(machine.read_text("/etc/os-release")),
        kernel=platform.release(),
        machine=platform.machine(),
        cpu=_cpu_name(machine.read_text("/proc/cpuinfo")) or platform.processor() or None,
        cpu_count=os.cpu_count(),
        memory_total=meminfo.get("MemTotal"),
        python=platform.python_version(),
        environment=relevant_environment(machine.environ),
    )


def _line(label: str, value: object) -> str:
    return f"- {label}: {value if value not in (None, '') else 'unknown'}"


def environment_report(
    result: DoctorResult, system: SystemInfo, now: datetime | None = None
) -> str:
    when = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    out = [
        "# sm120 environment report",
        "",
        f"Generated {when} by sm120 {__version__} (`sm120 doctor`), in place of "
        "`vllm collect-env`.",
        "",
        "## System",
        _line("OS", system.os_name),
        _line("kernel", f"{system.kernel} ({system.machine})"),
        _line("CPU", f"{system.cpu or 'unknown'}, {system.cpu_count or '?'} logical CPUs"),
        _line("memory", f"{system.memory_total / GIB:.1f} GiB" if system.memory_total else None),
        _line("sm120's Python", system.python),
        "",
    ]
    out += _nvidia_section(result)
    out += _engine_section(result)
    out += _docker_section(result)
    out += ["## Environment variables", ""]
    out += [f"- {k}={v}" for k, v in system.environment.items()] or ["- (none of interest set)"]
    out += ["", "## Findings", ""]
    for finding in result.findings:
        fix = f" Fix: {finding.remediation}" if finding.remediation else ""
        out.append(f"- [{finding.severity}] {finding.id}: {finding.message}.{fix}")
    return "\n".join(out) + "\n"


def _nvidia_section(result: DoctorResult) -> list[str]:
    out = ["## NVIDIA"]
    snap = result.gpu.snapshot if result.gpu else None
    if result.gpu is None:
        return [*out, "- not checked (the plan runs on the CPU)", ""]
    if snap is None:
        return [*out, f"- no GPU: {result.gpu.status} ({result.gpu.detail})", ""]
    out += [
        _line("driver", snap.driver_version),
        _line("CUDA (driver)", snap.cuda_version),
        _line("read through", snap.source),
        "",
        "| GPU | name | compute cap | memory total | memory used | bus id |",
        "|---|---|---|---|---|---|",
    ]
    for gpu in snap.gpus:
        out.append(
            f"| {gpu.index} | {gpu.name} | {gpu.compute_cap or '?'} | "
            f"{_mib(gpu.memory_total_mib)} | {_mib(gpu.memory_used_mib)} | {gpu.bus_id or '?'} |"
        )
    if snap.processes:
        out += ["", "Processes holding GPU memory:"]
        for proc in snap.processes:
            what = proc.command or proc.name
            out.append(f"- GPU{proc.gpu} pid {proc.pid} ({_mib(proc.used_mib)}): {what}")
    if snap.topology and snap.topology.links:
        links = ", ".join(f"{k} {v}" for k, v in sorted(snap.topology.links.items()))
        out += ["", f"Interconnect (topo -m): {links}"]
    if snap.p2p:
        out.append(
            "P2P (topo -p2p r): " + ", ".join(f"{k} {v}" for k, v in sorted(snap.p2p.items()))
        )
    return [*out, ""]


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,} MiB"


def _engine_section(result: DoctorResult) -> list[str]:
    out = ["## Engine"]
    engine = result.engine
    if engine is None:
        return [*out, "- no engine Python known (--vllm-python / VLLM_PYTHON)", ""]
    out.append(_line("python", f"{engine.python} ({engine.python_version or 'did not run'})"))
    if engine.error:
        out.append(_line("error", engine.error))
    cuda = engine.torch_cuda or ("CPU build" if engine.torch_version else None)
    out.append(
        _line("torch", f"{engine.torch_version} (CUDA {cuda})" if engine.torch_version else None)
    )
    out += [f"- {name}: {version}" for name, version in sorted(engine.packages.items())]
    return [*out, ""]


def _docker_section(result: DoctorResult) -> list[str]:
    out = ["## Containers"]
    state = result.docker
    if state is None:
        return [*out, "- not checked", ""]
    if not state.reachable or not state.info:
        return [*out, f"- Docker engine not reachable: {state.detail}", ""]
    runtimes = ", ".join(sorted(state.info.get("Runtimes") or {})) or "none"
    out += [
        _line("Docker engine", state.info.get("ServerVersion")),
        _line("runtimes", f"{runtimes} (default {state.info.get('DefaultRuntime', '?')})"),
    ]
    return [*out, ""]


def default_report_path() -> Path:
    return sm120_home() / "doctor" / REPORT_NAME


def write_report(text: str, path: Path) -> Path:
    # It describes the machine (drivers, devices, paths): for its owner's eyes.
    private_dir(path.parent)
    write_private_atomically(path, text)
    return path
