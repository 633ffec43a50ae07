"""Wait for an engine to become ready, showing the phase it is in as it happens."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sm120.client import ServerClient
from sm120.errors import SM120Error
from sm120.failures import Diagnosis, diagnose
from sm120.phases import Phase, PhaseUpdate, StartupTracker

TAIL_LINES = 40


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


class LogPump:
    """Reads engine log lines on a thread so the wait loop never blocks on the file."""

    def __init__(self, lines: Iterator[str]) -> None:
        self._lines = lines
        self._buffer: deque[str] = deque()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for line in self._lines:
            with self._lock:
                self._buffer.append(line)

    def drain(self) -> list[str]:
        with self._lock:
            lines = list(self._buffer)
            self._buffer.clear()
        return lines


def wait_until_ready(
    *,
    lines: Iterator[str],
    client: ServerClient,
    running: Callable[[], bool],
    exit_text: Callable[[], str],
    timeout_s: float,
    on_update: Callable[[PhaseUpdate | None, float], None],
    poll_s: float = 0.5,
) -> WaitResult:
    """Ready means /health answers 200; fails fast when the process exits or time runs out."""
    start = time.monotonic()
    result = WaitResult(StartupTracker(), 0.0)
    pump = LogPump(lines)
    while True:
        elapsed = time.monotonic() - start
        for line in pump.drain():
            result.tail.append(line)
            update = result.tracker.feed(line, time.time())
            if update is not None:
                on_update(update, elapsed)
        on_update(None, elapsed)
        if not running():
            _fail(f"the engine {exit_text()} before it was ready", result, pump)
        if client.health() == 200:
            result.tracker.feed("Application startup complete.", time.time())
            result.seconds = elapsed
            return result
        if elapsed > timeout_s:
            phase = result.tracker.phase.value if result.tracker.phase else "starting"
            _fail(
                f"not ready after {timeout_s:.0f} s (last phase: {phase})",
                result,
                pump,
                hint="raise the recipe's timeouts.ready_s (--set timeouts.ready_s=N) if it "
                "was still making progress",
            )
        time.sleep(poll_s)


def _fail(message: str, result: WaitResult, pump: LogPump, hint: str | None = None) -> None:
    time.sleep(0.2)  # let the last lines of a dying engine reach the log
    result.tail.extend(pump.drain())
    tail = list(result.tail)
    found = diagnose(tail)
    if found and hint is None:
        hint = f"{found[0].id}: {found[0].fix}"
    raise StartupFailed(message, hint or "see the log lines above", tail, found)


PHASE_WORDS = {
    Phase.starting: "starting the engine",
    Phase.loading_weights: "loading weights",
    Phase.compiling: "torch.compile",
    Phase.capturing_graphs: "capturing CUDA graphs",
    Phase.kv_cache: "sizing the KV cache",
    Phase.api_starting: "starting the API server",
    Phase.ready: "ready",
}
