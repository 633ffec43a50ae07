"""Telling a wedged server (F22) from a busy or compiling one (F21), and bounding restarts
(F26). Pure logic: the service feeds it scrapes and log lines, and acts on its verdicts.

A wedge is requests in flight while every progress counter (generated tokens, prompt
tokens, engine steps) stays frozen for `timeout_s`. Two things are not a wedge:
- an idle server (nothing running, nothing to make progress on);
- compile or warm-up work: the first request at a new prefill size bucket compiles kernels
  for minutes on big models (F21). A compile or JIT line in the log opens a compile window
  that lasts until the counters move again (bounded by `max_compile_s`).
GPU readings (sm120.monitor.gpu_activity), when there are any, sharpen the verdict: a wedge
needs the GPUs near idle power; frozen counters while the GPUs stay busy for `livelock_s`
are a livelock, restarted like a wedge. Without readings every verdict is as before.
The shared-memory broadcast line (F22's signature) says a request is in flight even when
the engine's gauges are stale, but alone it is not a wedge: startup and compiles print it
too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from sm120.engine.gpu_readings import GpuReading
from sm120.logs.phases import clean_line
from sm120.monitor.gpu_activity import DEFAULT_LIVELOCK_S, GpuState, gpu_state
from sm120.monitor.metrics import MetricsSnapshot, progress_counters
from sm120.recipe.restart_policy import DEFAULT_RESTART_BACKOFF_S

DEFAULT_WEDGE_TIMEOUT_S = 120.0
DEFAULT_MAX_COMPILE_S = 1800.0
DEFAULT_MAX_RESTARTS = 3
DEFAULT_RESTART_WINDOW_S = 6 * 3600.0
MAX_BACKOFF_S = 600.0
# Each restart keeps why it happened and the server's last lines; the newest few are kept.
KEPT_RECORDS = 10
RECORD_LOG_LINES = 20
# The broadcast line repeats every 60 s while a step is stuck: this long after the last one
# a request still counts as in flight.
STALL_LINE_MEMORY_S = 90.0

# Compile, JIT and warm-up work that legitimately freezes the counters (F21).
WARMUP_SIGNALS = re.compile(
    r"Starting torch\.compile|Compiling a graph for|Compiling graph for|torch\.compile takes"
    r"|Dynamo bytecode transform|Cache the graph of compile range|Directly load the compiled"
    r"|JIT kernel warmup|Capturing CUDA ?graphs|Capturing batches"
    r"|(?i:\bautotun|flashinfer.*\b(?:jit|compil)|\b(?:nvcc|ptxas|ninja)\b"
    r"|\bjit[- ]compil|compiling (?:kernel|module|cubin))"
)
# F22's signature (sm120/data/failures.yaml), matched on its own because it repeats.
STALL_LINE = re.compile(r"No available shared memory broadcast block found in \d+ seconds?")


class Activity(str, Enum):
    idle = "idle"
    serving = "serving"
    compiling = "compiling"
    stalled = "stalled"
    """Frozen with requests in flight, not yet for the wedge timeout."""
    wedged = "wedged"
    livelock = "livelock"
    """Frozen with requests in flight while the GPUs stay busy: spinning, not serving."""


# Verdicts the watchdog acts on (diagnostics, then a restart when the recipe allows).
RESTARTABLE = (Activity.wedged, Activity.livelock)


def frozen_verdict(
    frozen_s: float,
    gpus: GpuState,
    busy_for_s: float,
    timeout_s: float = DEFAULT_WEDGE_TIMEOUT_S,
    livelock_s: float = DEFAULT_LIVELOCK_S,
) -> Activity:
    """Requests in flight, counters frozen for `frozen_s`, outside any compile window."""
    if gpus is GpuState.busy:
        # Busy GPUs are not waiting on anything: never a wedge, a livelock once it lasts.
        return Activity.livelock if busy_for_s >= livelock_s else Activity.stalled
    if frozen_s < timeout_s:
        return Activity.stalled
    if gpus in (GpuState.idle, GpuState.unknown):
        return Activity.wedged
    # Neither idle nor busy: the readings cannot vouch for a wedge yet, but they only delay
    # the verdict (to the livelock window), never prevent one.
    return Activity.wedged if frozen_s >= livelock_s else Activity.stalled


@dataclass
class WedgeDetector:
    timeout_s: float = DEFAULT_WEDGE_TIMEOUT_S
    max_compile_s: float = DEFAULT_MAX_COMPILE_S
    livelock_s: float = DEFAULT_LIVELOCK_S
    _busy_since: float | None = None
    _counters: tuple[float | None, ...] | None = None
    _last_progress: float | None = None
    _compiling_since: float | None = None
    _stall_line_at: float | None = None
    _last_observed: float | None = None
    _was_idle: bool = True

    def note_line(self, line: str, now: float) -> None:
        """Feed every log line that arrives once the server is ready."""
        text = clean_line(line)
        if STALL_LINE.search(text):
            self._stall_line_at = now
        elif self._compiling_since is None and WARMUP_SIGNALS.search(text):
            self._compiling_since = now

    def compiling(self, now: float) -> bool:
        """Whether a compile or warm-up line opened a window that is still open."""
        since = self._compiling_since
        return since is not None and now - since < self.max_compile_s

    def reset(self, now: float) -> None:
        """A new server run (after a restart): nothing it did is frozen yet."""
        self._counters = None
        self._last_progress = now
        self._compiling_since = None
        self._stall_line_at = None
        self._last_observed = None
        self._was_idle = True
        self._busy_since = None

    def frozen_for(self, now: float) -> float:
        return 0.0 if self._last_progress is None else now - self._last_progress

    def busy_for(self, now: float) -> float:
        """How long the GPUs have stayed busy while the counters are frozen."""
        return 0.0 if self._busy_since is None else now - self._busy_since

    def observe(
        self, snapshot: MetricsSnapshot, now: float, gpus: Sequence[GpuReading] = ()
    ) -> Activity:
        activity = self._observe(snapshot, now, gpu_state(gpus))
        if activity not in (Activity.stalled, Activity.livelock):
            self._busy_since = None
        return activity

    def _observe(self, snapshot: MetricsSnapshot, now: float, gpus: GpuState) -> Activity:
        previous_observation, self._last_observed = self._last_observed, now
        counters = progress_counters(snapshot)
        if counters != self._counters or self._last_progress is None:
            self._counters = counters
            self._last_progress = now
            # Progress ends a compile window, but only one opened before the last look: a
            # compile line from this same poll may belong to work that starts now.
            if self._compiling_since is not None and (
                previous_observation is None or self._compiling_since <= previous_observation
            ):
                self._compiling_since = None
            busy = self._busy(snapshot, now)
            self._was_idle = not busy
            return Activity.serving if busy else Activity.idle
        if not self._busy(snapshot, now):
            # Idle is never frozen, and a compile only happens for a request.
            self._last_progress = now
            self._compiling_since = None
            self._was_idle = True
            return Activity.idle
        if self._was_idle:
            # Work first seen now: the request may have arrived just before this look.
            self._was_idle = False
            self._last_progress = now
        if self.compiling(now):
            self._last_progress = now
            return Activity.compiling
        if gpus is GpuState.busy:
            if self._busy_since is None:
                self._busy_since = now
        else:
            self._busy_since = None
        return frozen_verdict(
            self.frozen_for(now), gpus, self.busy_for(now), self.timeout_s, self.livelock_s
        )

    def _busy(self, snapshot: MetricsSnapshot, now: float) -> bool:
        if (snapshot.running or 0) > 0:
            return True
        return self._stall_line_at is not None and now - self._stall_line_at < STALL_LINE_MEMORY_S


@dataclass
class RestartRecord:
    """One restart the monitor made: when, why, and the server's last words before it."""

    at: float
    kind: str
    """What it restarted after: died, wedged or livelock."""
    reason: str
    log_tail: list[str] = field(default_factory=list)


@dataclass
class BreakerState:
    """What watchdog.json holds: the restarts the watchdog made (death relaunches and wedge
    restarts alike), and whether it gave up."""

    restarts: list[float] = field(default_factory=list)
    gave_up_at: float | None = None
    gave_up_reason: str | None = None
    records: list[RestartRecord] = field(default_factory=list)


@dataclass
class RestartBreaker:
    """At most `limit` restarts in any `window_s`; the next wedge or death trips it for good
    (until the user launches again), so a broken server cannot loop forever (F26). A death
    relaunch also waits `backoff_s` after the previous restart, doubling with each restart
    in the window (up to MAX_BACKOFF_S), so a server that dies at once is not hammered."""

    limit: int = DEFAULT_MAX_RESTARTS
    window_s: float = DEFAULT_RESTART_WINDOW_S
    state: BreakerState = field(default_factory=BreakerState)
    backoff_s: float = DEFAULT_RESTART_BACKOFF_S

    def recent(self, now: float) -> list[float]:
        return [at for at in self.state.restarts if now - at < self.window_s]

    def allows(self, now: float) -> bool:
        return self.state.gave_up_at is None and len(self.recent(now)) < self.limit

    def wait_s(self, now: float) -> float:
        """How long a relaunch must still wait (0: go ahead)."""
        recent = self.recent(now)
        if not recent:
            return 0.0
        backoff = min(self.backoff_s * 2.0 ** (len(recent) - 1), MAX_BACKOFF_S)
        return max(0.0, max(recent) + backoff - now)

    def record_restart(
        self, now: float, kind: str = "wedged", reason: str = "", log_tail: Sequence[str] = ()
    ) -> None:
        # Only the window matters: drop older entries so the file stays small.
        self.state.restarts = [*self.recent(now), now]
        record = RestartRecord(now, kind, reason, list(log_tail)[-RECORD_LOG_LINES:])
        self.state.records = [*self.state.records, record][-KEPT_RECORDS:]

    def give_up(self, now: float, reason: str) -> None:
        self.state.gave_up_at = now
        self.state.gave_up_reason = reason

    @property
    def gave_up(self) -> bool:
        return self.state.gave_up_at is not None

    @property
    def position(self) -> str:
        """The breaker's state as `status` names it: closed (restarts allowed) or open."""
        return "open" if self.gave_up else "closed"


def breaker_state_from(data: object) -> BreakerState:
    """watchdog.json as written by an earlier monitor; anything unreadable (a value of the
    wrong type, a time past what a float holds) is a fresh start."""
    try:
        return _breaker_state(data)
    except (TypeError, ValueError, OverflowError):
        return BreakerState()


def _breaker_state(data: object) -> BreakerState:
    if not isinstance(data, dict):
        return BreakerState()
    records = [
        RestartRecord(
            at=_time(item.get("at") or 0.0),
            kind=str(item.get("kind") or "restart"),
            reason=str(item.get("reason") or ""),
            log_tail=[str(line) for line in item.get("log_tail") or []],
        )
        for item in data.get("records") or []
        if isinstance(item, dict)
    ]
    gave_up_at = data.get("gave_up_at")
    return BreakerState(
        restarts=[_time(at) for at in data.get("restarts") or []],
        gave_up_at=None if gave_up_at is None else _time(gave_up_at),
        gave_up_reason=data.get("gave_up_reason"),
        records=records,
    )


def _time(value: object) -> float:
    """Seconds since 1970 that a clock could have written; anything else is damage."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("not a time")
    if not 0 <= value < 1e11:  # NaN fails this too
        raise ValueError("not a time")
    return float(value)
