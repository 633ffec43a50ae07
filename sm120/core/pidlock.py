"""A file that one process at a time holds locked (flock) and names itself in.

flock locks go with the process: when it ends, however it ends, the kernel lets go. So
"who holds it" never trusts a pid left in a file by a process that is long gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from sm120.core.bounded import is_regular_file, open_nonblocking


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
    """The pid of the process that holds the lock now, or None when nobody does.

    The pid written in the file counts only when the kernel agrees that this very process
    holds the lock (/proc/locks): a file anyone can write must never name whom `stop`
    signals, and a lock taken by some other program names no sm120 process at all."""
    held = _kernel_holders(path)
    if not held:
        return None
    written = _written_pid(path)
    return written if written in held else None


def lock_is_held(path: Path) -> bool:
    """Whether any process holds the lock, sm120's or not."""
    return bool(_kernel_holders(path))


def _written_pid(path: Path) -> int | None:
    if not is_regular_file(path):
        return None
    try:
        with path.open("rb") as handle:
            text = handle.read(32).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and len(text) < 10 else None


def _kernel_holders(path: Path) -> set[int]:
    """The pids the kernel lists as holding a flock on `path`; empty when it is free (or
    when `path` is no regular file: a FIFO there is nobody's lock)."""
    try:
        fd = open_nonblocking(path)
    except OSError:
        return set()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return set()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _flock_pids(os.fstat(fd).st_ino)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return set()
    finally:
        os.close(fd)


def _flock_pids(inode: int) -> set[int]:
    """Pids of the FLOCK entries of /proc/locks on `inode` (lines read
    "1: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF"; waiters, marked "->", hold nothing)."""
    try:
        lines = Path("/proc/locks").read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return set()
    pids = set()
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or not fields[4].isdigit():
            continue
        if fields[5].rsplit(":", 1)[-1] == str(inode):
            pids.add(int(fields[4]))
    return pids


def end_holder(pid: int, still_held: Callable[[], bool], timeout_s: float) -> None:
    """SIGTERM the process holding a lock and wait until it lets go; SIGKILL it after
    timeout_s, then wait a little for the kernel to release the lock of the killed process.
    `still_held` asks the lock again, so a pid reused by another process is never waited on."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while still_held():
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_released(still_held)
            return
        time.sleep(0.05)


def _wait_released(still_held: Callable[[], bool], wait_s: float = 5.0) -> None:
    deadline = time.monotonic() + wait_s
    while still_held() and time.monotonic() < deadline:
        time.sleep(0.05)
