"""Reads bounded by the bytes actually read, never by what the file system says.

`st_size` is 0 for devices, FIFOs and /proc files, so a size check before reading lets
`/dev/zero` through; every reader of a file a user hands us reads at most `limit + 1` bytes
and refuses the rest with one line. It is bounded in time too: the file is opened without
blocking (opening a FIFO nobody writes to waits forever otherwise) and anything but a
regular file is read against a deadline of PIPE_WAIT_S.
"""

from __future__ import annotations

import json
import os
import select
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from sm120.core.errors import SM120Error

MIB = 1 << 20
BLOCK_BYTES = 1 << 16
# How long a FIFO or device may take to deliver all it has: `--from <(ssh box nvidia-smi)`
# needs a few seconds, a FIFO nobody writes to would otherwise be waited on forever.
PIPE_WAIT_S = 30.0


class InputTooLarge(SM120Error):
    """A file or answer went past the bound its reader allows."""


class NotText(SM120Error):
    """A file that should hold UTF-8 text holds binary data."""


def size_words(limit: int) -> str:
    if limit >= MIB:
        return f"{limit / MIB:g} MiB"
    return f"{limit / 1024:g} KiB" if limit >= 1024 else f"{limit:,} bytes"


def read_capped(path: Path, limit: int, what: str, hint: str) -> bytes:
    """The bytes of `path`, or InputTooLarge once more than `limit` were read; a FIFO or
    device that has not ended within PIPE_WAIT_S is refused too."""
    try:
        fd = open_nonblocking(path)
    except IsADirectoryError:
        raise SM120Error(f"{what} {path} is a folder, not a file", hint) from None
    except OSError as exc:
        raise SM120Error(f"cannot read {what} {path}: {exc.strerror or exc}", hint) from None
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise SM120Error(f"{what} {path} is a folder, not a file", hint)
        data = _read_fd(fd, limit + 1, time.monotonic() + PIPE_WAIT_S)
    except TimeoutError:
        raise SM120Error(
            f"{what} {path} did not end within {PIPE_WAIT_S:g} s (a FIFO or device?)", hint
        ) from None
    except OSError as exc:
        raise SM120Error(f"cannot read {what} {path}: {exc.strerror or exc}", hint) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InputTooLarge(f"{what} {path} is larger than {size_words(limit)}", hint)
    return data


def open_nonblocking(path: Path) -> int:
    """A read-only descriptor of `path`, opened without waiting for a FIFO's writer; a
    regular file is switched back to blocking reads (they never wait long)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if stat.S_ISREG(os.fstat(fd).st_mode):
        os.set_blocking(fd, True)
    return fd


def is_regular_file(path: Path) -> bool:
    """Whether `path` (its final target) is a regular file; never blocks, never raises."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except (OSError, ValueError):
        return False


def _read_fd(fd: int, most: int, deadline: float) -> bytes:
    """Up to `most` bytes; a descriptor that is not a regular file is polled against
    `deadline` (TimeoutError past it), so neither a silent FIFO nor a trickle holds us."""
    if os.get_blocking(fd):
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(most)
    parts: list[bytes] = []
    size = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while size < most:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise TimeoutError
        try:
            block = os.read(fd, min(BLOCK_BYTES, most - size))
        except BlockingIOError:
            continue
        if not block:
            break
        parts.append(block)
        size += len(block)
    return b"".join(parts)


def decode_text(data: bytes, label: str, hint: str) -> str:
    """UTF-8 text; a NUL byte or an undecodable sequence means a binary file. `label` names
    the input in the error ("recipe /path/x.yaml")."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotText(f"{label} is not UTF-8 text (byte {exc.start})", hint) from None
    if "\x00" in text:
        raise NotText(f"{label} is not text (it holds NUL bytes)", hint)
    return text


def read_text_capped(path: Path, limit: int, what: str, hint: str) -> str:
    return decode_text(read_capped(path, limit, what, hint), f"{what} {path}", hint)


def read_json_capped(path: Path, limit: int, what: str, hint: str) -> object:
    """Parsed JSON of a bounded file; a file that is not JSON is one line, like any other."""
    text = read_text_capped(path, limit, what, hint)
    try:
        return json.loads(text)
    except RecursionError:
        raise SM120Error(f"{path} is JSON nested deeper than sm120 reads", hint) from None
    except ValueError as exc:
        raise SM120Error(f"{path} is not readable JSON: {exc}", hint) from None


def capped_lines(handle: BinaryIO, max_line: int) -> Iterator[bytes]:
    """Lines of a binary stream without their newline; a line longer than `max_line` is cut
    there and the rest of it skipped, so one endless line costs `max_line` bytes, not all."""
    partial = b""
    skipping = False
    while block := handle.read(BLOCK_BYTES):
        *complete, rest = block.split(b"\n")
        for piece in complete:
            if skipping:
                skipping = False
                continue
            yield (partial + piece)[:max_line]
            partial = b""
        if skipping:
            continue
        partial += rest
        if len(partial) > max_line:
            yield partial[:max_line]
            partial, skipping = b"", True
    if partial and not skipping:
        yield partial
