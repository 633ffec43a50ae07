"""Progress on stderr: a live status line on a terminal, one line per phase otherwise."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from rich.console import Console
from rich.status import Status
from rich.text import Text

from sm120.cli.provision_view import ProvisionDisplay
from sm120.deploy.wait import PHASE_WORDS
from sm120.logs.phases import Phase, PhaseUpdate


class PhaseProgress:
    def __init__(self, what: str, timeout_s: float) -> None:
        self.console = Console(stderr=True)
        self.what = what
        self.timeout_s = timeout_s
        self.phase: Phase | None = None
        self.detail: str | None = None
        self.status: Status | None = None
        self.started = time.monotonic()

    def __enter__(self) -> PhaseProgress:
        if self.console.is_terminal:
            self.started = time.monotonic()
            # Drawn anew at every refresh, so the clock runs while nothing is logged (the
            # preflight, building the tiny model, a quiet compile).
            self.status = self.console.status(_Ticking(self))
            self.status.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.status is not None:
            self.status.stop()

    @contextmanager
    def provisioning(self, what: str) -> Iterator[ProvisionDisplay]:
        """The engine install, with its own bars: the spinner steps aside (one live display
        at a time) and comes back for the start."""
        if self.status is not None:
            self.status.stop()
        try:
            with ProvisionDisplay(what, self.console) as shown:
                yield shown
        finally:
            # The engine's start is timed from here: the install had a clock of its own.
            self.started = time.monotonic()
            if self.status is not None:
                self.status.start()

    def asking(self, confirm: Callable[[str], bool] | None) -> Callable[[str], bool] | None:
        """The question on a line of its own: the spinner stops while it waits for the answer
        and its clock starts again after (the wait was the user's, not the engine's)."""
        if confirm is None:
            return None

        def ask(question: str) -> bool:
            if self.status is not None:
                self.status.stop()
            try:
                return confirm(question)
            finally:
                self.started = time.monotonic()
                if self.status is not None:
                    self.status.start()

        return ask

    def message(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/dim]", highlight=False, soft_wrap=True)

    def _text(self, elapsed: float) -> str:
        phase = (
            PHASE_WORDS.get(self.phase, "starting the engine")
            if self.phase
            else "starting the engine"
        )
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"{self.what}: {phase}{detail}  {elapsed:4.0f}s "
            f"[dim](waits up to {self.timeout_s:.0f}s for load, compile, graph capture)[/dim]"
        )

    def update(self, update: PhaseUpdate | None, elapsed: float) -> None:
        if update is not None:
            changed = update.phase != self.phase or update.detail != self.detail
            self.phase, self.detail = update.phase, update.detail
            if changed and self.status is None:
                self.console.print(
                    f"[{elapsed:5.0f}s] {PHASE_WORDS.get(update.phase, '')}"
                    + (f" ({update.detail})" if update.detail else ""),
                    highlight=False,
                )
        if self.status is not None:
            self.status.update(_Ticking(self))


class _Ticking:
    """The status line, rendered with the time elapsed since the start began."""

    def __init__(self, progress: PhaseProgress) -> None:
        self.progress = progress

    def __rich__(self) -> Text:
        elapsed = time.monotonic() - self.progress.started
        return Text.from_markup(self.progress._text(elapsed))
