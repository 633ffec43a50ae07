"""A file that one process at a time holds locked (flock) and names itself in.

flock locks go with the process: when it ends, however it ends, the kernel lets go. So
"who holds it" never trusts a pid left in a file by a process that is long gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO


class PidLock:
    """Held by at most one process; another one's `acquire` returns False at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Opened without truncating: the holder's pid stays readable until we hold the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        # Files of older versions were 0644: whoever holds the lock is the owner's business.
        with contextlib.suppress(PermissionError):
            os.fchmod(fd, 0o600)
        handle = os.fdopen(fd, "r+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle
        return True

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> PidLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def lock_holder(path: Path) -> int | None:
    """The pid of the process that holds the lock now, or None when nobody does."""
    try:
        handle = path.open(encoding="utf-8")
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            text = handle.read().strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None
