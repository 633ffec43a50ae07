"""The opt-in request log (`gateway start --request-log`): per request, the structure of its
prompt, not its text: the system prompt's length and hash and each of its lines' length and
hash (with a flag where a line holds a date, a time or an id), each tool's and each message's
length and hash, in the order sent, and what the engine said it took from its prefix cache.
`sm120 gateway analyze` reads it (sm120.gateway.analyze); docs/gateway.md documents the format.

Written by the usage writer's thread (never on the request path), one JSON line per request,
to requests/requests.jsonl (0600 in a 0700 folder), rotated at MAX_LOG_BYTES with KEPT_FILES
older files kept: bounded whatever the traffic.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from sm120.gateway.rotation import rotate_if_full

MAX_LOG_BYTES = 16 << 20
KEPT_FILES = 3
FORMAT_VERSION = 1
# What makes a system prompt line change every turn or every day.
_VOLATILE = (
    ("time", re.compile(r"\b\d{1,2}:\d{2}(:\d{2})?\b")),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b")),
    ("id", re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-|\b[0-9a-f]{16,}\b", re.I)),
    ("billing", re.compile(r"x-anthropic-billing-header", re.I)),
)


def short_hash(data: str) -> str:
    return hashlib.blake2b(data.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _text_of(value: object) -> str:
    """A system prompt as text: a string, or the text of its blocks in order."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(
            block.get("text", "") if isinstance(block, dict) else str(block) for block in value
        )
    return "" if value is None else _canonical(value)


def _lines(text: str) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for line in text.split("\n"):
        flags = [name for name, pattern in _VOLATILE if pattern.search(line)]
        rows.append([len(line), short_hash(line), *flags])
    return rows


def _items(values: object) -> list[list[Any]]:
    if not isinstance(values, list):
        return []
    return [[len(text := _canonical(value)), short_hash(text)] for value in values]


def _messages(values: object) -> list[list[Any]]:
    if not isinstance(values, list):
        return []
    rows: list[list[Any]] = []
    for message in values:
        role = message.get("role", "?") if isinstance(message, dict) else "?"
        text = _canonical(message.get("content") if isinstance(message, dict) else message)
        rows.append([str(role)[:16], len(text), short_hash(text)])
    return rows


def structure(protocol: str, body: dict[str, Any]) -> dict[str, Any]:
    """The prompt's shape: system, tools and messages, as lengths and hashes."""
    messages = body.get("messages")
    if protocol == "responses":
        system: object = body.get("instructions")
        messages = body.get("input") if isinstance(body.get("input"), list) else []
    elif protocol in ("messages", "count_tokens"):
        system = body.get("system")
    else:
        system = None
        if isinstance(messages, list):
            leading = [m for m in messages if isinstance(m, dict) and m.get("role") == "system"]
            system = "\n".join(_text_of(m.get("content")) for m in leading) if leading else None
            messages = [m for m in messages if m not in leading]
    text = _text_of(system)
    return {
        "system": {"len": len(text), "hash": short_hash(text), "lines": _lines(text)},
        "tools": _items(body.get("tools")),
        "messages": _messages(messages),
    }


class RequestLog:
    """The log file, appended to by one thread, rotated by size."""

    def __init__(self, path: Path, max_bytes: int = MAX_LOG_BYTES, kept: int = KEPT_FILES):
        self.path = path
        self.max_bytes = max_bytes
        self.kept = kept

    def write(self, row: dict[str, Any]) -> None:
        line = (json.dumps(row, separators=(",", ":")) + "\n").encode()
        rotate_if_full(self.path, len(line), self.max_bytes, self.kept)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def log_files(path: Path, kept: int = KEPT_FILES) -> list[Path]:
    """The log and its rotated files, oldest first."""
    older = [path.with_name(f"{path.name}.{n}") for n in range(kept, 0, -1)]
    return [p for p in (*older, path) if p.is_file()]
