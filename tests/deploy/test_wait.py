"""The launcher's wait for READY (sm120/deploy/wait.py), fed lines as a runtime would:
a lost start-up ends the wait in seconds and names the failure; a healthy one is untouched;
the phase named follows the log to its last line."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sm120.deploy.wait import (
    NEAR_READY_POLL_S,
    SETTLE_MAX_S,
    StartupFailed,
    poll_interval,
    wait_until_ready,
)
from sm120.logs.phases import Phase, StartupTracker
from tests.helpers import DATA_DIR


class Engine:
    """Lines as a runtime's follow() yields them, /health, and whether the process runs."""

    def __init__(
        self,
        lines: list[str],
        *,
        delay: float = 0.0,
        exits_after: bool = False,
        last_after: float = 0.0,
    ):
        self.lines = lines
        self.delay = delay
        self.last_after = last_after
        self.exits_after = exits_after
        self.done = threading.Event()
        self.healthy = False

    def follow(self) -> Iterator[str]:
        for line in self.lines[:-1]:
            time.sleep(self.delay)
            yield line
        time.sleep(self.last_after or self.delay)
        yield self.lines[-1]
        self.done.set()
        while True:  # a hung engine: the log just stops
            time.sleep(0.05)
            if self.exits_after:
                return

    def running(self) -> bool:
        return not (self.exits_after and self.done.is_set())

    def health(self) -> int:
        return 200 if self.healthy and self.done.is_set() else 503


def wait(engine: Engine, timeout_s: float = 60.0, **extra: Any) -> Any:
    return wait_until_ready(
        lines=engine.follow(),
        client=engine,  # type: ignore[arg-type]  # only health() is asked
        running=engine.running,
        exit_text=lambda: "exited with code 1",
        timeout_s=timeout_s,
        on_update=lambda update, elapsed: None,
        poll_s=0.05,
        **extra,
    )


CPU_START = (DATA_DIR / "vllm_logs" / "v0.32.0_cpu_tiny_live.log").read_text().splitlines()
# Where the real CPU start above compiles: the lines up to "Warming up model ...".
UP_TO_COMPILE = CPU_START[: next(i for i, x in enumerate(CPU_START) if "Warming up model" in x) + 1]
CPP_COMPILE_DEATH = [
    "(Worker pid=12315) ERROR 11-21 00:09:10 [multiproc_executor.py:1007] WorkerProc hit an "
    "exception.",
    "(EngineCore pid=11598) ERROR 11-21 00:09:10 [core.py:1330] EngineCore failed to start.",
    "(EngineCore pid=11598) ERROR 11-21 00:09:10 [core.py:1330] Traceback (most recent call last):",
    "(EngineCore pid=11598) ERROR 11-21 00:09:10 [core.py:1330] RuntimeError: Worker failed with "
    "error 'CppCompileError: C++ compile error', please check the stack trace above for the "
    "root cause",
]


def test_a_lost_start_ends_the_wait_in_seconds_with_the_engine_error_and_phase() -> None:
    started = time.monotonic()
    with pytest.raises(StartupFailed) as failed:
        wait(Engine(UP_TO_COMPILE + CPP_COMPILE_DEATH), timeout_s=600)
    assert time.monotonic() - started < SETTLE_MAX_S + 2
    assert failed.value.message == (
        "the engine failed 0 s into its start-up (phase: compiling): RuntimeError: Worker failed "
        "with error 'CppCompileError: C++ compile error', please check the stack trace above for "
        "the root cause"
    )
    assert failed.value.hint == "see the log lines above"
    assert failed.value.tail[-1] == CPP_COMPILE_DEATH[-1]


def test_a_fatal_catalogue_failure_is_named_with_its_fix() -> None:
    kv_too_small = (DATA_DIR / "vllm_logs" / "v0.11_cpu_kv_too_small.log").read_text().splitlines()
    lines = [*UP_TO_COMPILE, *kv_too_small]
    with pytest.raises(StartupFailed) as failed:
        wait(Engine(lines))
    assert failed.value.message == (
        "the engine failed 0 s into its start-up (phase: compiling): F08 Long context does not "
        "fit the KV cache (estimated maximum model length too small)"
    )
    assert failed.value.hint is not None and failed.value.hint.startswith(
        "F08: Shard the MLA KV with --decode-context-parallel-size"
    )
    assert failed.value.diagnoses[0].id == "F08"


def test_an_engine_that_exits_after_its_fatal_line_says_so_and_names_it() -> None:
    with pytest.raises(StartupFailed) as failed:
        wait(Engine(CPP_COMPILE_DEATH, exits_after=True))
    assert failed.value.message.startswith(
        "the engine exited with code 1 before it was ready: RuntimeError: Worker failed with "
        "error 'CppCompileError"
    )


def test_the_lines_after_the_fatal_one_are_read_before_naming_it() -> None:
    # The root error comes a moment after the line that trips the watch.
    engine = Engine([CPP_COMPILE_DEATH[1], CPP_COMPILE_DEATH[3]], delay=0.4)
    with pytest.raises(StartupFailed) as failed:
        wait(engine)
    assert "CppCompileError" in failed.value.message


def test_a_healthy_start_with_its_warnings_and_errors_is_ready() -> None:
    engine = Engine(CPU_START)
    engine.healthy = True
    result = wait(engine)
    assert result.tracker.phase is Phase.ready
    assert not result.watch.tripped


def test_the_timeout_names_the_phase_of_the_last_line() -> None:
    # The compile line arrives after the wait's last look at the log and before it gives up:
    # the phase named must be compiling, not the weights of the line before.
    engine = Engine(UP_TO_COMPILE, last_after=0.45)
    with pytest.raises(StartupFailed) as failed:
        wait(engine, timeout_s=0.3)
    assert failed.value.message == "not ready after 0 s (last phase: compiling)"


NCCL_INIT_THEN_SILENCE = [
    *UP_TO_COMPILE[:5],
    "host:3740804:3740804 [0] NCCL INFO comm 0xb923230 rank 0 nranks 2 cudaDev 0 nvmlDev 2 "
    "busId 56000 commId 0xb587bdc561ea636b - Init COMPLETE",
]


def test_a_start_that_goes_silent_after_nccl_init_is_named_a_p2p_hang() -> None:
    with pytest.raises(StartupFailed) as failed:
        wait(Engine(NCCL_INIT_THEN_SILENCE), timeout_s=0.5, silent_after_s=0.2)
    assert [found.id for found in failed.value.diagnoses] == ["F10"]
    assert failed.value.hint == (
        "F10: Set NCCL_P2P_DISABLE=1 (or disable ACS / IOMMU translation in the BIOS)."
    )


def test_a_start_still_writing_at_the_timeout_is_not_called_hung() -> None:
    with pytest.raises(StartupFailed) as failed:
        wait(Engine(NCCL_INIT_THEN_SILENCE), timeout_s=0.3, silent_after_s=60.0)
    assert failed.value.diagnoses == []
    assert failed.value.hint is not None and failed.value.hint.startswith(
        "raise the recipe's timeouts.ready_s"
    )


SERVER_STARTS = "(APIServer pid=1) INFO 11-28 22:53:14 [api_server.py:677] Starting vLLM server on http://127.0.0.1:8000"


class Clocked:
    """An engine whose log says the server starts at `starts_at` s and whose /health answers
    200 from `up_at` s; counts how often /health was asked."""

    def __init__(self, lines: list[str], starts_at: float, up_at: float) -> None:
        self.lines, self.starts_at, self.up_at = lines, starts_at, up_at
        self.began = time.monotonic()
        self.asked = 0

    def follow(self) -> Iterator[str]:
        spacing = self.starts_at / len(self.lines)
        for line in self.lines:
            time.sleep(spacing)
            yield line
        while True:
            time.sleep(0.05)

    def health(self) -> int | None:
        self.asked += 1
        return 200 if time.monotonic() - self.began >= self.up_at else None

    def wait(self, poll_s: float) -> float:
        wait_until_ready(
            lines=self.follow(),
            client=self,  # type: ignore[arg-type]  # only health() is asked
            running=lambda: True,
            exit_text=lambda: "exited",
            timeout_s=60,
            on_update=lambda update, elapsed: None,
            poll_s=poll_s,
        )
        return time.monotonic() - self.began


def test_the_poll_quickens_once_the_log_says_the_api_server_starts() -> None:
    tracker = StartupTracker()
    assert poll_interval(tracker, 0.5) == 0.5
    tracker.feed(UP_TO_COMPILE[-1], time.time())
    assert poll_interval(tracker, 0.5) == 0.5
    tracker.feed(SERVER_STARTS, time.time())
    assert poll_interval(tracker, 0.5) == NEAR_READY_POLL_S
    assert poll_interval(tracker, 0.01) == 0.01


def test_ready_follows_the_server_start_by_a_fast_poll_not_a_whole_poll_s() -> None:
    # Polled every 2 s throughout, READY would come at 2 s; the line that says the server
    # starts (0.3 s) wakes the wait, which then asks every NEAR_READY_POLL_S.
    engine = Clocked([*UP_TO_COMPILE[:3], SERVER_STARTS], starts_at=0.3, up_at=0.4)
    took = engine.wait(poll_s=2.0)
    assert 0.4 <= took < 0.4 + 0.35


def test_lines_while_loading_do_not_ask_the_engine_more_often_than_poll_s() -> None:
    # 40 lines over 1.2 s wake the wait 40 times; /health is asked once per poll_s still.
    engine = Clocked([*CPU_START[:39], SERVER_STARTS], starts_at=1.2, up_at=1.3)
    took = engine.wait(poll_s=0.5)
    assert took < 1.3 + 0.35
    # 0, 0.5, 1.0 while loading; then every 0.05 s from the start line (~1.2 s) to 1.3 s.
    assert engine.asked <= 3 + 5
