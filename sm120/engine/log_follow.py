"""Reading serve.log while it grows and rotates: `sm120 logs -f`, launch's wait, the monitor.

A reader holds the file open; when the writer rotates, the held file becomes serve.log.1 and
a new serve.log appears. The follower notices the new file, reads what is left of the old
one (and of any file in between), then carries on in the new one: nothing skipped, nothing
read twice.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from pathlib import Path
from typing import BinaryIO

from sm120.core.bounded import capped_lines, is_regular_file
from sm120.core.errors import SM120Error

NEWLINE = b"\n"
# Engines print lines of a few hundred bytes; one without end (a dumped tensor, a runaway
# print) is cut here and the rest of it skipped, so it costs this much memory, not its size.
MAX_LINE_BYTES = 1 << 20
CUT_MARK = " [line cut at 1 MiB]"
MAX_READ_BYTES = 64 << 20


def decode_line(line: bytes) -> str:
    if len(line) >= MAX_LINE_BYTES:
        return line[:MAX_LINE_BYTES].decode("utf-8", errors="replace") + CUT_MARK
    return line.rstrip(b"\r").decode("utf-8", errors="replace")


def backup_path(path: Path, index: int) -> Path:
    return path.with_name(f"{path.name}.{index}")


class LogFollower:
    """Hands out complete lines appended to `path` since the last call; never blocks."""

    def __init__(self, path: Path, *, at_end: bool = False, max_backups: int = 9) -> None:
        self.path = path
        self.max_backups = max_backups
        self._handle: BinaryIO | None = None
        self._identity: tuple[int, int] | None = None
        self._partial = b""
        self._skipping = False
        """Inside a line already cut at MAX_LINE_BYTES: drop bytes up to its newline."""
        self._open(at_end=at_end)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _open(self, *, at_end: bool) -> None:
        try:
            handle = open_log(self.path)
        except FileNotFoundError:
            return
        info = os.fstat(handle.fileno())
        if at_end:
            handle.seek(0, os.SEEK_END)
        self._handle, self._identity = handle, (info.st_dev, info.st_ino)

    def read_lines(self) -> list[str]:
        if self._handle is None:
            # A file that appears later is all new.
            self._open(at_end=False)
            if self._handle is None:
                return []
        data = self._read(self._handle)
        try:
            current = self.path.stat()
        except FileNotFoundError:
            current = None
        if current is None or (current.st_dev, current.st_ino) != self._identity:
            data += self._finish_rotated()
        elif current.st_size < self._handle.tell():
            # Truncated in place: start over from its beginning.
            self._handle.seek(0)
            self._partial, self._skipping = b"", False
            data = self._read(self._handle)
        return self._split(data)

    def _read(self, handle: BinaryIO) -> bytes:
        """What was appended, bounded: a writer far ahead is caught up over several calls."""
        return handle.read(MAX_READ_BYTES)

    def _finish_rotated(self) -> bytes:
        assert self._handle is not None
        # The writer never touches a file again once it has rotated it: read it to the end,
        # then every newer backup, then the new file.
        parts = [_read_all(self._handle)]
        for newer in self._files_between():
            with contextlib.suppress(FileNotFoundError), newer.open("rb") as handle:
                parts.append(_read_all(handle))
        self.close()
        self._open(at_end=False)
        if self._handle is not None:
            parts.append(self._read(self._handle))
        return b"".join(parts)

    def _files_between(self) -> list[Path]:
        """Backups newer than the one we held (when the writer rotated more than once)."""
        for index in range(1, self.max_backups + 1):
            candidate = backup_path(self.path, index)
            with contextlib.suppress(FileNotFoundError):
                info = candidate.stat()
                if (info.st_dev, info.st_ino) == self._identity:
                    return [backup_path(self.path, i) for i in range(index - 1, 0, -1)]
        return []

    def _split(self, data: bytes) -> list[str]:
        *complete, partial = data.split(NEWLINE)
        lines = []
        for piece in complete:
            if self._skipping:
                self._skipping = False  # the end of a line already handed out, cut
                continue
            lines.append(decode_line(self._partial + piece))
            self._partial = b""
        if not self._skipping:
            self._partial += partial
            if len(self._partial) >= MAX_LINE_BYTES:
                lines.append(decode_line(self._partial))
                self._partial, self._skipping = b"", True
        return lines

    def rest(self) -> list[str]:
        """The unfinished last line, once the writer is known to be gone."""
        rest, self._partial = self._partial, b""
        return [decode_line(rest)] if rest else []


def tail_lines(path: Path, count: int, max_backups: int = 9) -> tuple[list[str], int]:
    """The last `count` lines across serve.log and its backups, and how many lines the
    current file has (what a follower started afterwards should skip)."""
    last: deque[str] = deque(maxlen=max(count, 0))
    in_current = 0
    files = [backup_path(path, i) for i in range(max_backups, 0, -1)] + [path]
    for file in files:
        try:
            handle = open_log(file)
        except FileNotFoundError:
            continue
        with handle:
            for raw in capped_lines(handle, MAX_LINE_BYTES):
                last.append(decode_line(raw))
                if file == path:
                    in_current += 1
    return list(last), in_current


def open_log(path: Path) -> BinaryIO:
    """A log sm120 wrote: a regular file. A state file pointing at a FIFO would block the
    open forever, at /dev/zero the read; either is refused in one line."""
    if path.exists() and not is_regular_file(path):
        raise SM120Error(
            f"log {path} is not a regular file",
            "sm120 writes its logs itself; remove what is at that path, or the state naming it",
        )
    return path.open("rb")


def _read_all(handle: BinaryIO) -> bytes:
    """The rest of a rotated file (bounded by the writer's rotation size)."""
    return handle.read()
