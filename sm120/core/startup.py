"""Ctrl-C while sm120 is still starting. Run as the program (`sm120`, `python -m sm120`), an
interrupt while the modules are still importing ends it quietly: nothing has been done yet,
and Python would print a traceback from inside an import. app.main() hands SIGINT back to
Python before any command runs. Imported as a library (the tests), nothing is changed."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def _running_as_the_program() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name == "sm120.__main__":
        return True
    # The console script (bin/sm120); a plain split keeps pathlib out of the earliest import.
    return str(getattr(main, "__file__", "") or "").rsplit("/", 1)[-1] == "sm120"


def interrupted_while_starting(_signum: int, _frame: FrameType | None) -> None:
    sys.stderr.write("interrupted: nothing was started\n")
    os._exit(INTERRUPTED)


def quiet_while_importing() -> None:
    """Called by sm120/__init__.py, the first of sm120 a process imports."""
    if _running_as_the_program() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupted_while_starting)


def python_handles_interrupts() -> None:
    """Importing is over (app.main()): Ctrl-C is Python's KeyboardInterrupt again, which each
    command handles (a launch stops what it started; cli_errors says "interrupted")."""
    if signal.getsignal(signal.SIGINT) is interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
