"""Wait for an engine to become ready, showing the phase it is in as it happens."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sm120.core.errors import SM120Error
from sm120.logs.diagnosis.naming import name_failures
from sm120.logs.failures import Diagnosis
from sm120.logs.failures import get as get_failure
from sm120.logs.fatal import FatalStart, StartupWatch
from sm120.logs.phases import Phase, PhaseUpdate, StartupTracker
from sm120.server.client import ServerClient

TAIL_LINES = 40
# Once the log shows the start is lost, the rest of the engine's traceback (which names the
# cause) is still on its way, and the engine may still exit on its own: read on until the log
# is quiet this long or the engine is gone, at most SETTLE_MAX_S.
SETTLE_QUIET_S = 1.0
SETTLE_MAX_S = 3.0
# A start that times out with no log line for this long is hung where its log stops: the
# last line can then name the hang (F10: silence right after NCCL / P2P set-up).
SILENT_AFTER_S = 60.0
# /health is asked every poll_s while the engine loads; once its log says the API server is
# starting, every NEAR_READY_POLL_S, so READY follows the server's start by a few
# hundredths of a second rather than by up to a whole poll_s (a bare `vllm serve` script
# polling every 0.25 s would otherwise win by a poll).
NEAR_READY_POLL_S = 0.05
NEAR_READY = (Phase.api_starting, Phase.ready)


class StartupFailed(SM120Error):
    """The engine exited, or did not become ready in time."""

    def __init__(
        self, message: str, hint: str | None, tail: list[str], diagnoses: list[Diagnosis]
    ) -> None:
        super().__init__(message, hint)
        self.tail = tail
        self.diagnoses = diagnoses


@dataclass
class WaitResult:
    tracker: StartupTracker
    seconds: float
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    watch: StartupWatch = field(default_factory=StartupWatch)
    last_line_at: float | None = None  # time.monotonic() of the newest log line


class LogPump:
    """Reads engine log lines on a thread so the wait loop never blocks on the file."""

    def __init__(self, lines: Iterator[str]) -> None:
        self._lines = lines
        self._buffer: deque[str] = deque()
        self._lock = threading.Lock()
        self._arrived = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for line in self._lines:
            with self._lock:
                self._buffer.append(line)
                self._arrived.set()

    def drain(self) -> list[str]:
        with self._lock:
            lines = list(self._buffer)
            self._buffer.clear()
            self._arrived.clear()
        return lines

    def wait(self, timeout_s: float) -> None:
        """Until a line arrives or `timeout_s` passes, whichever is first."""
        self._arrived.wait(max(timeout_s, 0.0))


def wait_until_ready(
    *,
    lines: Iterator[str],
    client: ServerClient,
    running: Callable[[], bool],
    exit_text: Callable[[], str],
    timeout_s: float,
    on_update: Callable[[PhaseUpdate | None, float], None],
    poll_s: float = 0.5,
    engine: str | None = None,
    silent_after_s: float = SILENT_AFTER_S,
) -> WaitResult:
    """Ready means /health answers 200. Fails fast when the process exits, when its log shows
    the start is lost (the API process of a dead engine may live on), or when time runs out.
    Lines are read as they arrive; the engine is asked every `poll_s`, and every
    NEAR_READY_POLL_S once its log says the API server is starting."""
    start = time.monotonic()
    result = WaitResult(StartupTracker(), 0.0, watch=StartupWatch(engine=engine))
    pump = LogPump(lines)
    checked_at: float | None = None
    while True:
        now = time.monotonic()
        elapsed = now - start
        _read(pump.drain(), result, on_update, elapsed)
        interval = poll_interval(result.tracker, poll_s)
        if checked_at is None or now - checked_at >= interval:
            checked_at = now
            on_update(None, elapsed)
            if _check(result, pump, client, running, exit_text, timeout_s, silent_after_s, start):
                result.seconds = elapsed
                return result
        # A new line wakes the loop early: the one that says the server starts shortens the poll.
        pump.wait(checked_at + interval - time.monotonic())


def poll_interval(tracker: StartupTracker, poll_s: float) -> float:
    """How often the engine is asked: every `poll_s`, faster once the API server starts."""
    return min(poll_s, NEAR_READY_POLL_S) if tracker.phase in NEAR_READY else poll_s


def _check(
    result: WaitResult,
    pump: LogPump,
    client: ServerClient,
    running: Callable[[], bool],
    exit_text: Callable[[], str],
    timeout_s: float,
    silent_after_s: float,
    start: float,
) -> bool:
    """True when the engine is ready; raises StartupFailed when it never will be."""
    elapsed = time.monotonic() - start
    if result.watch.tripped:
        _settle(pump, result, running)
        if running():
            _fail_fatal(result, elapsed)
    if not running():
        _fail(f"the engine {exit_text()} before it was ready", result, pump)
    if client.health() == 200:
        result.tracker.feed("Application startup complete.", time.time())
        return True
    if elapsed > timeout_s:
        # The phase named follows the log to its last line.
        _read_last_lines(pump, result)
        quiet = time.monotonic() - (result.last_line_at or start)
        _fail(
            f"not ready after {timeout_s:.0f} s (last phase: {_phase(result)})",
            result,
            pump,
            hint="raise the recipe's timeouts.ready_s (--set timeouts.ready_s=N) if it "
            "was still making progress",
            went_silent=quiet >= silent_after_s,
        )
    return False


def _read(
    lines: list[str],
    result: WaitResult,
    on_update: Callable[[PhaseUpdate | None, float], None] | None,
    elapsed: float,
) -> None:
    """Every line goes to the tail, the phase tracker and the fatal-line watch."""
    if lines:
        result.last_line_at = time.monotonic()
    for line in lines:
        result.tail.append(line)
        result.watch.feed(line)
        update = result.tracker.feed(line, time.time())
        if update is not None and on_update is not None:
            on_update(update, elapsed)


def _settle(pump: LogPump, result: WaitResult, running: Callable[[], bool]) -> None:
    """Read what the dying engine still writes, until its log goes quiet or it is gone."""
    deadline = time.monotonic() + SETTLE_MAX_S
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        lines = pump.drain()
        if lines:
            _read(lines, result, None, 0.0)
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= SETTLE_QUIET_S or not running():
            return


def _fail_fatal(result: WaitResult, elapsed: float) -> None:
    """The engine is still running, but its log says the start is lost."""
    verdict = result.watch.verdict()
    assert verdict is not None  # only called once the watch tripped
    _raise(
        f"the engine failed {elapsed:.0f} s into its start-up (phase: {_phase(result)}): "
        f"{verdict.describe()}",
        result,
        verdict,
    )


def _fail(
    message: str,
    result: WaitResult,
    pump: LogPump,
    hint: str | None = None,
    *,
    went_silent: bool = False,
) -> None:
    _read_last_lines(pump, result)
    verdict = result.watch.verdict()
    if verdict is not None:
        message = f"{message}: {verdict.describe()}"
    _raise(message, result, verdict, hint, went_silent=went_silent)


def _raise(
    message: str,
    result: WaitResult,
    verdict: FatalStart | None,
    hint: str | None = None,
    *,
    went_silent: bool = False,
) -> None:
    tail = list(result.tail)
    found = name_failures(tail, went_silent=went_silent)
    # The failure that killed the start comes first, even when its line left the tail.
    if verdict is not None and verdict.failure is not None:
        found = [verdict.failure, *(other for other in found if other.id != verdict.failure.id)]
    hang = [named for named in found if went_silent and get_failure(named.id).silent_after]
    if hang:
        hint = f"{hang[0].id}: {hang[0].fix}"  # a hang is named: waiting longer will not help
    elif found and hint is None:
        hint = f"{found[0].id}: {found[0].fix}"
    raise StartupFailed(message, hint or "see the log lines above", tail, found)


def _phase(result: WaitResult) -> str:
    return result.tracker.phase.value if result.tracker.phase else "starting"


def _read_last_lines(pump: LogPump, result: WaitResult) -> None:
    time.sleep(0.2)  # let the last lines of a dying engine reach the log
    _read(pump.drain(), result, None, 0.0)


PHASE_WORDS = {
    Phase.starting: "starting the engine",
    Phase.loading_weights: "loading weights",
    Phase.compiling: "torch.compile",
    Phase.capturing_graphs: "capturing CUDA graphs",
    Phase.kv_cache: "sizing the KV cache",
    Phase.api_starting: "starting the API server",
    Phase.ready: "ready",
}
