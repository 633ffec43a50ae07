"""The wedge detector (F22) with its compile exemption (F21), and the restart breaker (F26)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from sm120.monitor.metrics import MetricsSnapshot
from sm120.monitor.watchdog import (
    MAX_BACKOFF_S,
    Activity,
    RestartBreaker,
    WedgeDetector,
    breaker_state_from,
)
from tests.fakes.engine_logs import COMPILE_LINE
from tests.helpers import snap

STALL_LINE = (
    "(EngineCore pid=12) WARNING 06-30 04:12:00 [shm_broadcast.py:466] No available shared "
    "memory broadcast block found in 60 seconds. This typically happens when some processes "
    "are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
    "quantization)."
)


def test_frozen_counters_with_running_requests_wedge_at_the_timeout() -> None:
    detector = WedgeDetector(timeout_s=120)
    assert detector.observe(snap(100), 0.0) is Activity.serving
    assert detector.observe(snap(100), 60.0) is Activity.stalled
    assert detector.observe(snap(100), 119.0) is Activity.stalled
    assert detector.observe(snap(100), 120.0) is Activity.wedged
    assert detector.frozen_for(120.0) == 120.0


def test_progress_resets_the_clock() -> None:
    detector = WedgeDetector(timeout_s=10)
    detector.observe(snap(1), 0.0)
    assert detector.observe(snap(1), 9.0) is Activity.stalled
    assert detector.observe(snap(2), 9.5) is Activity.serving
    assert detector.observe(snap(2), 19.0) is Activity.stalled
    assert detector.observe(snap(2), 19.5) is Activity.wedged


def test_a_long_prefill_moving_only_the_step_counter_is_progress() -> None:
    detector = WedgeDetector(timeout_s=10)
    detector.observe(snap(5), 0.0)
    chunked = MetricsSnapshot(
        at=0.0,
        mono=0.0,
        counters={"generation_tokens": 5, "prompt_tokens": 10, "iterations": 9},
        running=1.0,
    )
    assert detector.observe(chunked, 30.0) is Activity.serving


def test_idle_is_never_a_wedge() -> None:
    detector = WedgeDetector(timeout_s=10)
    detector.observe(snap(5, running=0), 0.0)
    assert detector.observe(snap(5, running=0), 1000.0) is Activity.idle
    # Work arriving after a long idle starts a fresh clock.
    assert detector.observe(snap(5, running=1), 1001.0) is Activity.stalled
    assert detector.observe(snap(5, running=1), 1010.0) is Activity.stalled
    assert detector.observe(snap(5, running=1), 1011.0) is Activity.wedged


def test_a_compile_line_exempts_until_progress() -> None:
    detector = WedgeDetector(timeout_s=10, max_compile_s=600)
    detector.observe(snap(5), 0.0)
    detector.note_line(COMPILE_LINE, 2.0)
    assert detector.observe(snap(5), 300.0) is Activity.compiling
    assert detector.observe(snap(5), 590.0) is Activity.compiling
    # The compile finished: tokens flow again and the exemption is over.
    assert detector.observe(snap(6), 600.0) is Activity.serving
    assert detector.observe(snap(6), 611.0) is Activity.wedged


def test_a_compile_that_never_ends_is_a_wedge_after_max_compile() -> None:
    detector = WedgeDetector(timeout_s=10, max_compile_s=100)
    detector.observe(snap(5), 0.0)
    detector.note_line("INFO [monitor.py:40] Starting torch.compile", 1.0)
    assert detector.observe(snap(5), 99.0) is Activity.compiling
    assert detector.observe(snap(5), 102.0) is Activity.stalled
    assert detector.observe(snap(5), 110.0) is Activity.wedged


def test_a_compile_line_in_the_same_poll_as_progress_still_counts() -> None:
    detector = WedgeDetector(timeout_s=10)
    detector.observe(snap(5), 0.0)
    detector.note_line(COMPILE_LINE, 4.0)  # the compile starts right after the last tokens
    assert detector.observe(snap(6), 5.0) is Activity.serving
    assert detector.observe(snap(6), 60.0) is Activity.compiling


@pytest.mark.parametrize(
    "line",
    [
        "INFO 11-21 [kernel_warmup.py:176] JIT kernel warmup starting.",
        "[flashinfer] INFO: Loading JIT ops: batch_prefill_with_kv_cache (compiling)",
        "Autotuning process starts ...",
        "ninja: building 3 targets",
        "INFO [backends.py:62] Compiling a graph for dynamic shape takes 31.2 s",
    ],
)
def test_warmup_signals(line: str) -> None:
    detector = WedgeDetector(timeout_s=10)
    detector.observe(snap(5), 0.0)
    detector.note_line(line, 1.0)
    assert detector.observe(snap(5), 50.0) is Activity.compiling


def test_ordinary_lines_are_not_compile_signals() -> None:
    detector = WedgeDetector(timeout_s=10)
    detector.observe(snap(5), 0.0)
    detector.note_line(
        "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 "
        "tokens/s, Running: 1 reqs, Waiting: 0 reqs",
        1.0,
    )
    assert detector.observe(snap(5), 50.0) is Activity.wedged


def test_the_stall_line_means_in_flight_even_with_stale_gauges() -> None:
    # A request that reached a stuck engine never showed up in its gauges.
    detector = WedgeDetector(timeout_s=60)
    detector.observe(snap(5, running=0), 0.0)
    detector.note_line(STALL_LINE, 61.0)
    assert detector.observe(snap(5, running=0), 62.0) is Activity.stalled
    assert detector.observe(snap(5, running=0), 122.0) is Activity.wedged
    # Long after the last such line, a frozen idle server is just idle.
    assert detector.observe(snap(5, running=0), 400.0) is Activity.idle


def test_reset_starts_a_new_run() -> None:
    detector = WedgeDetector(timeout_s=10)
    detector.observe(snap(5), 0.0)
    detector.observe(snap(5), 20.0)
    detector.reset(20.0)
    assert detector.observe(snap(0), 21.0) is Activity.serving
    assert detector.frozen_for(21.0) == 0.0


def test_breaker_allows_the_limit_then_refuses() -> None:
    breaker = RestartBreaker(limit=3, window_s=6 * 3600)
    for at in (0.0, 100.0, 200.0):
        assert breaker.allows(at)
        breaker.record_restart(at)
    assert not breaker.allows(300.0)
    assert breaker.recent(300.0) == [0.0, 100.0, 200.0]


def test_breaker_window_slides() -> None:
    breaker = RestartBreaker(limit=2, window_s=3600)
    breaker.record_restart(0.0)
    breaker.record_restart(1800.0)
    assert not breaker.allows(3599.0)
    assert breaker.allows(3600.0)  # the first restart left the window
    breaker.record_restart(3600.0)
    assert breaker.state.restarts == [1800.0, 3600.0]


def test_gave_up_stays_given_up() -> None:
    breaker = RestartBreaker(limit=1, window_s=10)
    breaker.record_restart(0.0)
    breaker.give_up(5.0, "1 watchdog restarts in the last 0.002778 h")
    assert breaker.gave_up
    assert not breaker.allows(10_000.0)  # only a launch by hand clears it


def test_zero_restarts_never_restarts() -> None:
    assert not RestartBreaker(limit=0).allows(0.0)


def test_backoff_doubles_with_each_restart_in_the_window_up_to_the_cap() -> None:
    breaker = RestartBreaker(limit=20, window_s=24 * 3600, backoff_s=10.0)
    assert breaker.wait_s(0.0) == 0.0  # the first death is relaunched at once
    breaker.record_restart(100.0, "died", "the engine killed by SIGKILL")
    assert breaker.wait_s(100.0) == 10.0
    assert breaker.wait_s(104.0) == 6.0
    assert breaker.wait_s(111.0) == 0.0
    breaker.record_restart(111.0)
    assert breaker.wait_s(111.0) == 20.0
    for at in range(200, 2000, 100):
        breaker.record_restart(float(at))
    assert breaker.wait_s(1900.0) == MAX_BACKOFF_S


def test_restarts_out_of_the_window_no_longer_delay() -> None:
    breaker = RestartBreaker(limit=2, window_s=60.0, backoff_s=30.0)
    breaker.record_restart(0.0)
    assert breaker.wait_s(10.0) == 20.0
    assert breaker.wait_s(61.0) == 0.0 and breaker.allows(61.0)


def test_each_restart_keeps_its_reason_and_last_lines_bounded() -> None:
    breaker = RestartBreaker(limit=50)
    lines = [f"line {n}" for n in range(100)]
    for at in range(12):
        breaker.record_restart(float(at), "died", f"death {at}", lines)
    records = breaker.state.records
    assert [record.reason for record in records] == [f"death {at}" for at in range(2, 12)]
    assert records[-1].log_tail == lines[-20:] and records[-1].kind == "died"


def test_the_breaker_file_round_trips_and_tolerates_an_older_one() -> None:
    breaker = RestartBreaker(limit=1)
    breaker.record_restart(5.0, "wedged", "frozen", ["a", "b"])
    breaker.give_up(6.0, "limit")
    again = breaker_state_from(asdict(breaker.state))
    assert again == breaker.state
    assert RestartBreaker(limit=1, state=again).position == "open"
    # watchdog.json from before restart records, and garbage: both read as something usable.
    older = breaker_state_from({"restarts": [1.0], "gave_up_at": None})
    assert older.restarts == [1.0] and older.records == []
    assert breaker_state_from(["not", "a", "dict"]).restarts == []
    assert RestartBreaker().position == "closed"
