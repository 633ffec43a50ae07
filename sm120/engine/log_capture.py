"""Engine output into logs/serve.log, rotated, with no line lost or written twice.

One capture, two hosts. A native run's supervisor (sm120.engine.runtime.supervise) is the engine's
parent and pumps its stdout pipe here, so every byte the engine writes reaches the file even
when nobody watches. A container's output is copied by the Docker runtime's detached
follower (sm120.engine.runtime.docker_logs), which reads `docker logs` through the same `LogSource`
protocol.

Exactly once across a re-attach: a replayable source (a container's log) hands out a
position with every chunk, and the capture stores it in a cursor file together with where
the chunk ended in serve.log. A capture killed between writing lines and saving the cursor
finds more lines in serve.log than the cursor accounts for, and skips exactly that many when
the source replays them. Rotation only ever happens between lines.

Standard library only: the supervisor imports this module and must start fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 3
READ_SIZE = 64 * 1024
CURSOR_SAVE_INTERVAL_S = 1.0
NEWLINE = b"\n"
STREAM_START = ""  # a cursor position: nothing of the stream consumed yet


class RotatingLogWriter:
    """Appends whole lines to `path`; before a line would cross max_bytes the file becomes
    path.1 (path.1 becomes path.2, ... the oldest beyond `backups` is dropped)."""

    def __init__(
        self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS
    ) -> None:
        if max_bytes <= 0 or backups < 0:
            raise ValueError("max_bytes must be positive and backups at least 0")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fd = -1
        self._size = 0
        self._identity = (0, 0)
        self._open()

    def _open(self) -> None:
        # Engine logs can echo secrets from the command line: keep them private.
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        info = os.fstat(self._fd)
        self._size = info.st_size
        self._identity = (info.st_dev, info.st_ino)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RotatingLogWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def backup_path(self, index: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{index}")

    def write(self, data: bytes) -> None:
        """Append complete lines (data must end with a newline)."""
        while data:
            room = self.max_bytes - self._size
            if len(data) <= room:
                self._write_all(data)
                return
            cut = data.rfind(NEWLINE, 0, room) + 1
            if cut == 0 and self._size == 0:
                # One line longer than a whole file: it gets a file of its own.
                cut = data.find(NEWLINE) + 1 or len(data)
            if cut:
                self._write_all(data[:cut])
                data = data[cut:]
            self.rotate()

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(data)

    def rotate(self) -> None:
        """Start a new file now (also used by launch so each launch starts a fresh log)."""
        self.close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for index in range(self.backups - 1, 0, -1):
                if self.backup_path(index).exists():
                    self.backup_path(index).replace(self.backup_path(index + 1))
            if self.path.exists():
                self.path.replace(self.backup_path(1))
        self._open()

    # --- torn lines and marks, for an exact resume ---------------------------------------

    def torn_tail(self) -> bool:
        """True when the file ends inside a line (its writer was killed mid-write)."""
        return self._size > 0 and os.pread(self._fd, 1, self._size - 1) != NEWLINE

    def end_torn_line(self) -> None:
        """Keep a torn last line, but end it so the next line starts on its own."""
        if self.torn_tail():
            self._write_all(NEWLINE)

    def drop_torn_line(self) -> None:
        """Remove a torn last line: a replayable source will deliver it again, whole."""
        if not self.torn_tail():
            return
        end = self._size
        while end > 0:
            start = max(0, end - READ_SIZE)
            block = os.pread(self._fd, end - start, start)
            cut = block.rfind(NEWLINE)
            if cut >= 0:
                self._truncate(start + cut + 1)
                return
            end = start
        self._truncate(0)

    def _truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self._size = size

    def mark(self) -> tuple[int, int, int]:
        """(device, inode, size) of the current file: where the last write ended."""
        return (*self._identity, self._size)

    def lines_since(self, device: int, inode: int, offset: int) -> int:
        """Complete lines written after a mark, across any rotations since."""
        files = [self.path] + [self.backup_path(i) for i in range(1, self.backups + 1)]
        for age, path in enumerate(files):
            try:
                info = path.stat()
            except FileNotFoundError:
                continue
            if (info.st_dev, info.st_ino) == (device, inode):
                newer = files[:age]
                return _count_lines(path, offset) + sum(_count_lines(p, 0) for p in newer)
        # The marked file has been rotated away; nothing older than it can be told apart.
        return 0


def start_fresh_log(path: Path) -> None:
    """Begin a new serve.log for a new launch; earlier runs move to the backups."""
    with RotatingLogWriter(path) as writer:
        if writer.mark()[2] > 0:
            writer.rotate()


def _count_lines(path: Path, offset: int) -> int:
    count = 0
    with contextlib.suppress(FileNotFoundError), path.open("rb") as handle:
        handle.seek(offset)
        while block := handle.read(READ_SIZE * 16):
            count += block.count(NEWLINE)
    return count


# --- sources -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogChunk:
    """Whole lines, each ending in a newline (empty: nothing new yet, check stop()), and the
    source's position after them, to hand back to `read(after=...)` on a re-attach."""

    data: bytes
    position: str


class LogSource(Protocol):
    """Where engine output comes from.

    `identity` names one output stream (a process run, a container id): a stored position
    is only reused for the same identity. `read(after)` yields chunks from just after
    `after` (None: from the stream's start) until the stream ends; a source that cannot
    replay (a pipe) ignores `after`. Sources should yield an empty chunk now and then
    while idle so the capture can notice stop().
    """

    @property
    def identity(self) -> str: ...

    def read(self, after: str | None) -> Iterator[LogChunk]: ...


class ProcessOutputSource:
    """A process's stdout (stderr merged) read from a pipe: the native runtime's source.

    Positions are line counts; a pipe cannot be replayed, and does not need to be: the
    supervisor holding it is the process's parent and outlives it.
    """

    def __init__(self, fd: int, identity: str) -> None:
        self._fd = fd
        self._identity = identity

    @property
    def identity(self) -> str:
        return self._identity

    def read(self, after: str | None) -> Iterator[LogChunk]:
        lines = 0
        partial = b""
        while True:
            try:
                data = os.read(self._fd, READ_SIZE)
            except OSError:
                data = b""
            if not data:
                break
            data = partial + data
            cut = data.rfind(NEWLINE) + 1
            partial = data[cut:]
            if cut:
                lines += data.count(NEWLINE, 0, cut)
                yield LogChunk(data[:cut], str(lines))
        if partial:
            # The process ended mid-line: keep what it said, as a line of its own.
            yield LogChunk(partial + NEWLINE, str(lines + 1))


# --- the capture -----------------------------------------------------------------------------


@dataclass
class CaptureCursor:
    identity: str
    position: str
    device: int
    inode: int
    offset: int


def never() -> bool:
    return False


class Capture:
    """Pumps a LogSource into a RotatingLogWriter; with a cursor file it resumes exactly."""

    def __init__(
        self,
        writer: RotatingLogWriter,
        cursor_path: Path | None = None,
        save_interval_s: float = CURSOR_SAVE_INTERVAL_S,
    ) -> None:
        self.writer = writer
        self.cursor_path = cursor_path
        self.save_interval_s = save_interval_s
        self.lines_written = 0

    def pump(self, source: LogSource, stop: Callable[[], bool] = never) -> int:
        """Copy until the source ends or stop(); returns the lines written by this call."""
        after, skip = self._resume(source.identity)
        if after is None:
            # Mark where this stream begins before writing any of it: a capture killed
            # before its first timed save then resumes by skipping what it wrote, instead
            # of replaying the stream from its start on top of it.
            self._save(source.identity, STREAM_START)
        written = 0
        position = after
        last_save = time.monotonic()
        try:
            for chunk in source.read(after):
                data = chunk.data
                if skip and data:
                    data, skip = _drop_lines(data, skip)
                if data:
                    self.writer.write(data)
                    written += data.count(NEWLINE)
                if chunk.data:
                    position = chunk.position
                now = time.monotonic()
                if position is not None and now - last_save >= self.save_interval_s:
                    self._save(source.identity, position)
                    last_save = now
                if stop():
                    break
        finally:
            if position is not None:
                self._save(source.identity, position)
            self.lines_written += written
        return written

    def _resume(self, identity: str) -> tuple[str | None, int]:
        if self.cursor_path is None:
            self.writer.end_torn_line()
            return None, 0
        cursor = load_cursor(self.cursor_path)
        if cursor is None or cursor.identity != identity:
            self.writer.end_torn_line()
            return None, 0
        # A torn line and any whole lines past the cursor will come again from the source.
        self.writer.drop_torn_line()
        skip = self.writer.lines_since(cursor.device, cursor.inode, cursor.offset)
        return (None if cursor.position == STREAM_START else cursor.position), skip

    def _save(self, identity: str, position: str) -> None:
        if self.cursor_path is None:
            return
        device, inode, offset = self.writer.mark()
        save_cursor(self.cursor_path, CaptureCursor(identity, position, device, inode, offset))


def _drop_lines(data: bytes, count: int) -> tuple[bytes, int]:
    """Drop up to `count` leading lines; returns what is left and how many still to drop."""
    start = 0
    while count and start < len(data):
        start = data.index(NEWLINE, start) + 1
        count -= 1
    return data[start:], count


def load_cursor(path: Path) -> CaptureCursor | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return CaptureCursor(**data)
    except (FileNotFoundError, ValueError, TypeError, RecursionError):
        return None


def save_cursor(path: Path, cursor: CaptureCursor) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(asdict(cursor), handle)
        Path(tmp_name).replace(path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
