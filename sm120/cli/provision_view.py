"""Provisioning the engine as the user sees it: a phase of its own with a byte-level bar per
package (size, rate, time left) on a terminal, and readable lines without one."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from sm120.engine.pip_progress import DownloadAdvanced, DownloadStarted, parse_pip_line


class ProvisionDisplay:
    """Takes provisioning's output lines (sm120.engine.engine_env.Progress) one at a time."""

    def __init__(self, what: str, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.what = what
        self.started = time.monotonic()
        self.bars: Progress | None = None
        self.phase_task: TaskID | None = None
        self.download: TaskID | None = None
        self.package = ""
        self.size = 0  # the current download's size as pip announced it (0: not stated)
        self.downloads = 0
        self.downloaded = 0  # bytes of finished downloads
        self.last: DownloadAdvanced | None = None  # the current download's latest count

    def __enter__(self) -> ProvisionDisplay:
        self.console.print(f"provisioning the engine: {self.what} (once; reused afterwards)")
        if self.console.is_terminal:
            self.bars = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.bars.start()
            # The phase's own line: its elapsed time runs even while pip prints nothing.
            self.phase_task = self.bars.add_task("provisioning", total=None)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._finish_download()
        if self.bars is not None:
            self.bars.stop()
        if kind is None:
            self.console.print(
                f"provisioned in {time.monotonic() - self.started:.0f}s "
                f"({self.downloaded / 1e6:,.0f} MB downloaded)",
                highlight=False,
            )

    def __call__(self, line: str) -> None:
        event = parse_pip_line(line)
        if isinstance(event, DownloadAdvanced):
            self._advance(event)
        elif isinstance(event, DownloadStarted):
            self._finish_download()
            self.package, self.size = event.package, event.size
            self.downloads += 1
            if self.bars is not None:
                self.download = self.bars.add_task(_short(event.package), total=event.size or None)
                self._show_phase()
            else:
                self.console.print(f"  downloading {event.package}", highlight=False)
        elif self._finish_download() or self.bars is not None:
            # pip's other lines (Collecting, Requirement already satisfied, ...) are its own
            # chatter: the phase line says what provisioning has done instead.
            self._show_phase()
        else:
            self.console.print(f"[dim]{event.text}[/dim]", highlight=False, soft_wrap=True)

    def _show_phase(self) -> None:
        if self.bars is None or self.phase_task is None:
            return
        description = f"provisioning: {self.downloads} downloaded"
        if self.downloaded:
            description += f", {self.downloaded / 1e6:,.0f} MB"
        self.bars.update(self.phase_task, description=description)

    def _advance(self, event: DownloadAdvanced) -> None:
        total = event.total or self.size
        if self.bars is not None and self.download is not None:
            self.bars.update(self.download, completed=event.done, total=total or None)
        self.last = event
        if total and event.done >= total:
            self._finish_download()

    def _finish_download(self) -> bool:
        """Count the current download as done (False: returned for the caller's `or`)."""
        # pip names the next package (or ends) only once a download is complete: without
        # byte counts (a pip before 24.1), the size it announced is what arrived.
        done = self.last.done if self.last is not None else self.size
        if self.download is not None or self.last is not None or self.size:
            self.downloaded += done
            if self.bars is None and done:
                self.console.print(f"    {done / 1e6:,.1f} MB", highlight=False)
        self.last, self.size = None, 0
        if self.bars is not None and self.download is not None:
            self.bars.remove_task(self.download)
        self.download = None
        self._show_phase()
        return False


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
