"""Cleanup that a second Ctrl-C must not cut short."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_held() -> Iterator[list[int]]:
    """While the body runs, SIGINT and SIGTERM are noted (in the list yielded), not raised:
    for the stop that ends an interrupted or failed launch, which a second Ctrl-C would
    otherwise leave half done, with the engine running. The caller is already ending, so
    a noted signal asks for nothing more. Outside the main thread (where no signal handler
    runs) the body runs as it is."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum: int, _frame: object) -> None:
        noted.append(signum)

    previous = {signum: signal.signal(signum, note) for signum in HELD}
    try:
        yield noted
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
