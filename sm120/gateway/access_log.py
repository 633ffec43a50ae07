"""The gateway's access log: one line per request and one per lifecycle event, in a plain
file under the gateway's folder (`sm120 logs --gateway` shows it).

What a line holds: when, the client's address, method, path (never its query), the model
asked for, the deployment that answered, status, bytes sent, time to the first byte and in
all, and whether the fast path answered or the application. `bytes` is the answer's bytes
as sent: the fast path, which copies the engine's answer whole, counts its head too; the
application counts the body. Never a body or a header: no
key reaches this file, not even a prefix. Lines are kept in memory and written by a timer
(or once the buffer is big), so a request's answer never waits on the disk; the file is
rotated at ROTATE_BYTES, keeping KEPT_FILES older ones, so it cannot fill the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from sm120.gateway.rotation import rotate_if_full

ROTATE_BYTES = 8 * 1024 * 1024
KEPT_FILES = 3
FLUSH_EVERY_S = 0.5
FLUSH_LINES = 256  # a burst is written at once rather than held for the timer
MAX_FIELD_CHARS = 128
# A client chooses the model and the path: nothing it sends may break a line or forge one.
_UNSAFE = re.compile(r"[^\x21-\x7e]")


def _field(value: object) -> str:
    text = "-" if value is None or value == "" else str(value)
    return _UNSAFE.sub("?", text[:MAX_FIELD_CHARS])


def _text(value: object) -> str:
    """Free text (a refusal's reason) as one JSON string: quoted, no line breaks."""
    return json.dumps(str(value)[: MAX_FIELD_CHARS * 2], ensure_ascii=True)


def _stamp(at: float) -> str:
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at))
    return f"{whole}.{int(at % 1 * 1000):03d}Z"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


@dataclass
class RequestRecord:
    """One request as it goes: filled in by whichever side serves it, written once at its end."""

    client: str
    method: str
    path: str
    via: str  # "fast" (the front's own pipe) or "app" (handed to the application)
    started: float = field(default_factory=time.monotonic)
    at: float = field(default_factory=time.time)
    model: str | None = None
    deployment: str | None = None
    status: int = 0
    sent: int = 0
    first_byte: float | None = None

    def first_bytes(self, data: bytes) -> None:
        """The answer's first bytes are on their way: its status line is among them."""
        self.first_byte = time.monotonic()
        if data.startswith(b"HTTP/1.") and data[9:12].isdigit():
            self.status = int(data[9:12])

    def line(self, ended: float) -> str:
        ttfb = None if self.first_byte is None else self.first_byte - self.started
        return (
            f"{_stamp(self.at)} {_field(self.client)} {_field(self.method)} "
            f"{_field(self.path)} model={_field(self.model)} "
            f"deployment={_field(self.deployment)} status={self.status or '-'} "
            f"bytes={self.sent} ttfb_ms={_ms(ttfb)} ms={_ms(ended - self.started)} "
            f"via={self.via}"
        )


# The application's record of the request it serves (proxy._access_logged), for the relay
# to note its first byte and the handler its model and deployment.
LOGGED: web.RequestKey[RequestRecord] = web.RequestKey("logged", RequestRecord)


class AccessLog:
    """The buffered, rotated file. `finish` and `event` only append to memory; the event
    loop's timer writes (a few KB at most), outside any request's answer."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: list[str] = []
        self._timer: asyncio.TimerHandle | None = None

    def finish(self, record: RequestRecord) -> None:
        self._add(record.line(time.monotonic()))

    def event(self, kind: str, reason: object = None, **details: object) -> None:
        """A lifecycle line (start, stop, swap, refusal): one-word details, then a reason."""
        parts = [f"{name}={_field(value)}" for name, value in details.items()]
        if reason is not None:
            parts.append(f"reason={_text(reason)}")
        self._add(" ".join([_stamp(time.time()), f"event={_field(kind)}", *parts]))

    def _add(self, line: str) -> None:
        self._pending.append(line)
        if len(self._pending) >= FLUSH_LINES:
            self.flush()
            return
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # outside the loop (start refused, shutting down): now
                self.flush()
                return
            self._timer = loop.call_later(FLUSH_EVERY_S, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        text = "\n".join(self._pending) + "\n"
        self._pending.clear()
        with contextlib.suppress(OSError):  # a full disk must not take the gateway down
            rotate_if_full(self.path, len(text), ROTATE_BYTES, KEPT_FILES)
            # Private like the rest of the gateway's folder: it names who called, and when.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="ascii", errors="replace") as out:
                out.write(text)


def address_text(peer: object) -> str:
    """A socket's peer as a log field: host:port for TCP, '-' for anything else."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return "-"


class HandedOver:
    """Which client a handed-over connection came from: the front names the application's
    end of each internal socket (its autobound abstract address) before it connects, so the
    application's log line carries the real client, not the internal socket."""

    def __init__(self) -> None:
        self._clients: dict[object, str] = {}

    def add(self, internal_name: object, client: str) -> None:
        self._clients[internal_name] = client

    def discard(self, internal_name: object) -> None:
        self._clients.pop(internal_name, None)

    def client(self, peer: object) -> str:
        return self._clients.get(peer) or address_text(peer)

    def __iter__(self) -> Iterator[object]:
        return iter(self._clients)
