"""GPU readings in the watchdog: a scripted NVML source drives wedge, livelock and compile
verdicts; without readings every verdict is the one the counters alone give."""

from __future__ import annotations

import pytest

from sm120.engine.gpu_readings import GpuReading, ScriptedSource
from sm120.monitor.gpu_activity import GpuState, describe_gpus, gpu_state
from sm120.monitor.watchdog import Activity, WedgeDetector, frozen_verdict
from tests.fakes.engine_logs import COMPILE_LINE
from tests.helpers import snap

# A 600 W card: idle with weights loaded, spinning in a kernel, and NCCL spin-waiting.
IDLE = GpuReading(0, util_pct=0.0, power_w=62.0, power_limit_w=600.0, temperature_c=40.0)
SPINNING = GpuReading(0, util_pct=100.0, power_w=540.0, power_limit_w=600.0, temperature_c=83.0)
NCCL_WAIT = GpuReading(0, util_pct=100.0, power_w=95.0, power_limit_w=600.0)
HALF = GpuReading(0, util_pct=50.0, power_w=250.0, power_limit_w=600.0)


@pytest.mark.parametrize(
    ("readings", "state"),
    [
        ([], GpuState.unknown),
        ([GpuReading(0)], GpuState.unknown),  # a card that reports nothing says nothing
        ([IDLE, IDLE], GpuState.idle),
        ([NCCL_WAIT], GpuState.idle),  # 100 % "util" at idle power is a wait, not work
        ([IDLE, SPINNING], GpuState.busy),  # one rank spinning is a spin
        ([HALF], GpuState.between),
        ([GpuReading(0, util_pct=2.0)], GpuState.idle),  # no power sensor: util decides
        ([GpuReading(0, util_pct=95.0)], GpuState.busy),
        ([GpuReading(0, power_w=400.0, power_limit_w=600.0)], GpuState.busy),
    ],
)
def test_gpu_state(readings: list[GpuReading], state: GpuState) -> None:
    assert gpu_state(readings) is state


@pytest.mark.parametrize(
    ("frozen", "gpus", "busy_for", "verdict"),
    [
        (119, GpuState.unknown, 0, Activity.stalled),
        (120, GpuState.unknown, 0, Activity.wedged),  # no readings: as before
        (120, GpuState.idle, 0, Activity.wedged),
        (600, GpuState.busy, 299, Activity.stalled),  # busy GPUs are never a wedge
        (600, GpuState.busy, 300, Activity.livelock),
        (120, GpuState.between, 0, Activity.stalled),
        (300, GpuState.between, 0, Activity.wedged),  # readings only delay the verdict
    ],
)
def test_frozen_verdict(frozen: float, gpus: GpuState, busy_for: float, verdict: Activity) -> None:
    assert frozen_verdict(frozen, gpus, busy_for, timeout_s=120, livelock_s=300) is verdict


def drive(detector: WedgeDetector, source: ScriptedSource, times: list[float]) -> list[Activity]:
    """Requests running, counters frozen after the first look, one GPU read per look."""
    return [detector.observe(snap(100), at, source.read()) for at in times]


def test_idle_gpus_confirm_a_wedge_at_the_timeout() -> None:
    detector = WedgeDetector(timeout_s=120, livelock_s=300)
    seen = drive(detector, ScriptedSource([[IDLE, IDLE]]), [0, 60, 120])
    assert seen == [Activity.serving, Activity.stalled, Activity.wedged]


def test_busy_gpus_with_frozen_counters_are_a_livelock_after_the_window() -> None:
    detector = WedgeDetector(timeout_s=120, livelock_s=300)
    seen = drive(detector, ScriptedSource([[SPINNING]]), [0, 10, 130, 309, 310])
    assert seen == [
        Activity.serving,
        Activity.stalled,
        Activity.stalled,  # past the wedge timeout, but the GPUs are working
        Activity.stalled,
        Activity.livelock,  # busy since t=10: 300 s
    ]
    assert detector.busy_for(310) == 300


def test_a_pause_in_the_spin_starts_the_livelock_window_over() -> None:
    detector = WedgeDetector(timeout_s=1000, livelock_s=300)
    source = ScriptedSource([[SPINNING], [SPINNING], [HALF], [SPINNING], [SPINNING]])
    seen = drive(detector, source, [0, 10, 200, 250, 549])
    assert seen[-1] is Activity.stalled  # busy again only since t=250
    assert detector.observe(snap(100), 550, [SPINNING]) is Activity.livelock


def test_a_compile_with_busy_gpus_is_not_a_livelock() -> None:
    detector = WedgeDetector(timeout_s=120, max_compile_s=1800, livelock_s=300)
    detector.observe(snap(100), 0.0, [SPINNING])
    detector.note_line(COMPILE_LINE, 5.0)
    for at in (10.0, 400.0, 1700.0):
        assert detector.observe(snap(100), at, [SPINNING]) is Activity.compiling
    assert detector.busy_for(1700.0) == 0.0
    # Past the longest compile the spin counts, from the first look after the window.
    assert detector.observe(snap(100), 1810.0, [SPINNING]) is Activity.stalled
    assert detector.observe(snap(100), 2110.0, [SPINNING]) is Activity.livelock


def test_no_gpu_readings_give_exactly_the_counter_verdicts() -> None:
    with_gpus, without = WedgeDetector(timeout_s=120), WedgeDetector(timeout_s=120)
    times = [0.0, 60.0, 119.0, 120.0, 500.0]
    counters = [snap(100), snap(100), snap(100), snap(100), snap(101)]
    empty = [with_gpus.observe(c, t, []) for c, t in zip(counters, times, strict=True)]
    plain = [without.observe(c, t) for c, t in zip(counters, times, strict=True)]
    assert (
        empty
        == plain
        == [
            Activity.serving,
            Activity.stalled,
            Activity.stalled,
            Activity.wedged,
            Activity.serving,
        ]
    )


def test_progress_ends_the_livelock_clock() -> None:
    detector = WedgeDetector(timeout_s=120, livelock_s=300)
    drive(detector, ScriptedSource([[SPINNING]]), [0, 10, 200])
    assert detector.busy_for(200) == 190
    assert detector.observe(snap(101), 210, [SPINNING]) is Activity.serving
    assert detector.busy_for(210) == 0.0


def test_describe_gpus() -> None:
    assert describe_gpus([SPINNING, GpuReading(1)]) == "GPU0 100% 540 W, GPU1 - -"
    assert describe_gpus([]) == "no GPU readings"
