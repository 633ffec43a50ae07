"""Reads bounded by the bytes actually read, never by what the file system says.

`st_size` is 0 for devices, FIFOs and /proc files, so a size check before reading lets
`/dev/zero` through; every reader of a file a user hands us reads at most `limit + 1` bytes
and refuses the rest with one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from sm120.core.errors import SM120Error

MIB = 1 << 20
BLOCK_BYTES = 1 << 16


class InputTooLarge(SM120Error):
    """A file or answer went past the bound its reader allows."""


class NotText(SM120Error):
    """A file that should hold UTF-8 text holds binary data."""


def size_words(limit: int) -> str:
    if limit >= MIB:
        return f"{limit / MIB:g} MiB"
    return f"{limit / 1024:g} KiB" if limit >= 1024 else f"{limit:,} bytes"


def read_capped(path: Path, limit: int, what: str, hint: str) -> bytes:
    """The bytes of `path`, or InputTooLarge once more than `limit` were read."""
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except IsADirectoryError:
        raise SM120Error(f"{what} {path} is a folder, not a file", hint) from None
    except OSError as exc:
        raise SM120Error(f"cannot read {what} {path}: {exc.strerror or exc}", hint) from None
    if len(data) > limit:
        raise InputTooLarge(f"{what} {path} is larger than {size_words(limit)}", hint)
    return data


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
