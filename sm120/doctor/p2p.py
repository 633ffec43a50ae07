"""`sm120 doctor --p2p`: try GPU peer-to-peer and an all-reduce for real, in the engine's
own Python, with a hard timeout per step (F10, F10b).

The probe (sm120/doctor/p2p_probe.py) runs as one subprocess - an argv list, never a shell -
in a process group of its own, with its all-reduce ranks inside that group. A step that
outlives its timeout is a hang: the whole group is killed and the step is reported as F10,
the hang NCCL's P2P transport shows on PCIe boxes with ACS / IOMMU in the way.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any

from sm120.core.errors import SM120Error
from sm120.doctor.findings import Finding

PROBE_SCRIPT = "p2p_probe.py"
# Multi-GPU runs keep NVLink multicast (NVLS) off, as the project's GPU runs do.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
PEER_ACCESS_REFUSED = "peer access is not supported"
STDERR_TAIL_LINES = 5
ENDED_EARLY = "the probe ended in the middle of this step"
KILL_WAIT_S = 15.0


@dataclass(frozen=True)
class ProbeLimits:
    """Hard timeouts, in seconds, per step of the probe."""

    start_s: float = 180.0  # import torch and find the devices (cold caches are slow)
    copy_s: float = 30.0  # one GPU-to-GPU copy, repeated and verified
    all_reduce_s: float = 120.0  # start the ranks, build the process group, reduce once

    def for_step(self, step: str) -> float:
        if step in ("torch", "start", "between steps"):
            return self.start_s
        if step.startswith("copy"):
            return self.copy_s
        return self.all_reduce_s


@dataclass(frozen=True)
class StepResult:
    step: str
    ok: bool
    seconds: float
    timed_out: bool = False
    detail: str = ""
    gbps: float | None = None
    peer_access: bool | None = None

    def document(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "timed_out": self.timed_out,
            "detail": self.detail,
            "gbps": self.gbps,
            "peer_access": self.peer_access,
        }


@dataclass
class P2PReport:
    """What the probe found: every step it reached, and how the first failure is named."""

    world: int
    steps: list[StepResult] = field(default_factory=list)
    backend: str | None = None
    error: str | None = None  # the probe could not run at all (no torch, bad interpreter)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.steps) and all(step.ok for step in self.steps)

    @property
    def first_failure(self) -> StepResult | None:
        return next((step for step in self.steps if not step.ok), None)

    @property
    def failure_id(self) -> str | None:
        """F10b when the driver refused peer access, F10 for a hang or a wrong result."""
        failed = self.first_failure
        if failed is None or self.error is not None:
            return None
        return "F10b" if PEER_ACCESS_REFUSED in failed.detail else "F10"

    def document(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "world": self.world,
            "backend": self.backend,
            "failure": self.failure_id,
            "error": self.error,
            "steps": [step.document() for step in self.steps],
        }


def probe_script() -> Path:
    return Path(str(resources.files("sm120.doctor").joinpath(PROBE_SCRIPT)))


def probe_env(base: Mapping[str, str], gpus: tuple[int, ...] | None) -> dict[str, str]:
    """The probe's environment: the caller's, multicast off, and the plan's GPUs only."""
    env = {**base, **MULTICAST_OFF}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index) for index in gpus)
    return env


def run_p2p_probe(
    python: str,
    world: int,
    *,
    env: Mapping[str, str],
    limits: ProbeLimits | None = None,
) -> P2PReport:
    """Run the probe with `world` all-reduce ranks; nothing it started outlives this call."""
    limits = limits or ProbeLimits()
    report = P2PReport(world=world)
    argv = [python, str(probe_script()), "--world", str(world), "--port", str(free_port())]
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as stderr:
        try:
            process = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                text=True,
                start_new_session=True,
            )
        except OSError as exc:
            report.error = f"cannot run {python}: {exc.strerror}"
            return report
        try:
            _follow(process, report, limits)
        finally:
            kill_group(process)
        failed = report.first_failure
        if not report.steps or (failed is not None and failed.step == "torch"):
            report.error = _stderr_tail(stderr) or "the probe printed nothing"
        elif failed is not None and failed.detail == ENDED_EARLY:
            index = report.steps.index(failed)
            tail = _stderr_tail(stderr) or "no error output"
            report.steps[index] = StepResult(failed.step, False, failed.seconds, False, tail)
    return report


def _follow(process: subprocess.Popen[str], report: P2PReport, limits: ProbeLimits) -> None:
    assert process.stdout is not None
    lines = _LineReader(process.stdout)
    step: str | None = None
    started = time.monotonic()
    deadline = started + limits.start_s
    while True:
        line = lines.next_line(deadline)
        if line is None:  # the step outlived its timeout, or the probe ended early
            if time.monotonic() >= deadline:
                name = step or "start"
                limit = limits.for_step(name)
                detail = f"no answer within {limit:.0f} s (hung)"
                report.steps.append(
                    StepResult(name, False, time.monotonic() - started, True, detail)
                )
            elif step is not None:
                seconds = time.monotonic() - started
                report.steps.append(StepResult(step, False, seconds, False, ENDED_EARLY))
            return
        event = _parse(line)
        if event.get("event") == "begin":
            step = str(event.get("step"))
            started = time.monotonic()
            deadline = started + limits.for_step(step)
        elif event.get("event") == "end":
            report.steps.append(_step_result(event, time.monotonic() - started))
            report.backend = event.get("backend") or report.backend
            # The next step begins at once; a probe stuck in between is hung too.
            step, started = "between steps", time.monotonic()
            deadline = started + limits.start_s
        elif event.get("event") == "done":
            return


def _step_result(event: dict[str, Any], seconds: float) -> StepResult:
    step = str(event.get("step"))
    ok = event.get("ok") is True
    detail = str(event.get("error") or "")
    if not ok and not detail and step == "all-reduce":
        detail = f"wrong result: got {event.get('got')}, expected {event.get('expected')}"
    if not ok and not detail and step.startswith("copy"):
        detail = "wrong result: the copy differs from what was sent"
    gbps = event.get("gbps")
    peer = event.get("peer_access")
    return StepResult(
        step,
        ok,
        seconds,
        detail=detail,
        gbps=float(gbps) if isinstance(gbps, int | float) else None,
        peer_access=peer if isinstance(peer, bool) else None,
    )


def _parse(line: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


class _LineReader:
    """Lines of a pipe, each waited for only until a deadline.

    Reads the file descriptor itself: a buffered reader would hold lines that already
    arrived while select() waits for more.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._fd = stream.fileno()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._buffer = b""
        self._ended = False

    def next_line(self, deadline: float) -> str | None:
        """The next line, or None at end of stream or once the deadline has passed."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if self._ended or remaining <= 0:
                return None
            if self._selector.select(timeout=remaining):
                chunk = os.read(self._fd, 65536)
                self._ended = not chunk
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", errors="replace")


def kill_group(process: subprocess.Popen[str]) -> None:
    """End the probe and every rank it started (they share its process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    if process.stdout is not None:
        process.stdout.close()
    try:
        process.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        # A process stuck inside the GPU driver ignores even SIGKILL until the driver lets go.
        raise SM120Error(
            f"the P2P probe (pid {process.pid}) did not end after SIGKILL: the GPU is wedged",
            "reset the GPUs (nvidia-smi -r) or reboot, then set NCCL_P2P_DISABLE=1",
        ) from None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stderr_tail(stderr: IO[str]) -> str:
    stderr.seek(0)
    lines = [line.rstrip() for line in stderr.read().splitlines() if line.strip()]
    return " | ".join(lines[-STDERR_TAIL_LINES:])


def p2p_findings(report: P2PReport) -> list[Finding]:
    """One finding per pair copy and one for the all-reduce (doctor's view of the report)."""
    if report.error is not None:
        return [
            Finding(
                "p2p",
                "error",
                f"the P2P probe did not run: {report.error}",
                "check the engine's Python (--vllm-python) has a working torch",
            )
        ]
    return [_step_finding(step, report) for step in report.steps if step.step != "torch"]


def _step_finding(step: StepResult, report: P2PReport) -> Finding:
    name = f"p2p-{step.step.replace(' ', '-').replace('->', '-to-')}"
    data = step.document()
    if step.ok:
        if step.gbps is not None:
            how = "peer access" if step.peer_access else "through host memory (no peer access)"
            message = f"{step.step}: {step.gbps:.1f} GB/s, verified ({how})"
        else:
            message = f"{step.step} over {report.world} ranks ({report.backend}): correct"
        return Finding(name, "ok", f"{message} in {step.seconds:.1f} s", data=data)
    failure = "F10b" if PEER_ACCESS_REFUSED in step.detail else "F10"
    return Finding(
        name,
        "error",
        f"{step.step}: {step.detail}",
        "set NCCL_P2P_DISABLE=1 (sm120 launch does this itself after a failed probe), "
        "or disable ACS / IOMMU translation in the BIOS",
        failure=failure,
        data=data,
    )
