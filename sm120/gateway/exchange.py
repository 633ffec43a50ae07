"""One request on one kept-alive engine socket, its answer copied to the client byte for byte
as it arrives (sm120.gateway.front's fast path). Everything runs in the socket callbacks: no
task, no future, no await between the engine's bytes and the client's socket."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from sm120.gateway.backends import Backend
from sm120.gateway.relay import (
    NO_RETRY,
    NO_RETRY_STATUSES,
    READ_TIMEOUT_S,
    ROUTE_MISS_BYTES,
    engine_headers,
    error_bytes,
    is_route_miss,
)
from sm120.gateway.upstream import UpstreamConnection
from sm120.gateway.usage import Tap
from sm120.server.framing import FramingError, RequestHead, ResponseFraming

# How an exchange ended.
ANSWERED = "answered"  # the whole answer reached the client
HAND_OVER = "hand over"  # nothing reached the client: the full application answers instead
RETRY = "retry"  # the socket was gone before any byte of an answer came back
CUT = "cut"  # part of an answer reached the client, then one side went away


class Client(Protocol):
    def send(self, data: bytes) -> None: ...


class Exchange:
    def __init__(
        self,
        client: Client,
        upstream: UpstreamConnection,
        request: bytes,
        deployment: str,
        route_miss: Callable[[], bytes] | None,
        finished: Callable[[Exchange, str], None],
        tap: Tap | None = None,
        *,
        bounded: bool = True,
        head_request: bool = False,
        marks_no_retry: bool = True,
    ) -> None:
        """`route_miss`: the answer that replaces an engine's web-framework 404 (None: every
        404 passes, as the application's own do); `bounded`: the other side may be silent
        READ_TIMEOUT_S at most (not for the application, which keeps its own bounds);
        `marks_no_retry`: an answer a retry cannot change gets `x-should-retry: false` here
        (not the application's, which carry it already)."""
        self.client = client
        self._tap = tap  # sees the answer go by, for the usage record
        self.upstream = upstream
        self.deployment = deployment
        self._route_miss = route_miss
        self._marks_no_retry = marks_no_retry
        self.framing = ResponseFraming(no_body=head_request)
        self.outcome: str | None = None
        self._finished = finished
        self._held = bytearray()  # the answer's head, until its status is known
        self._forwarded = False
        self._extra = False  # bytes after the answer's end: the socket cannot be reused
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._last_read = loop.time()
        self._read_timeout_s = READ_TIMEOUT_S
        self._watchdog = loop.call_later(READ_TIMEOUT_S, self._watch) if bounded else None
        upstream.on_data, upstream.on_lost = self._on_data, self._on_lost
        if upstream.lost:
            self._on_lost()
        else:
            upstream.send(request)

    @property
    def reusable(self) -> bool:
        framing = self.framing
        return (
            self.outcome == ANSWERED
            and framing.done
            and framing.keep_alive
            and not self._extra
            and not self.upstream.lost
        )

    @property
    def forwarded(self) -> bool:
        """Part of the answer has reached the client."""
        return self._forwarded

    def cut(self) -> None:
        """The client went away: the engine's socket is closed, so it stops generating."""
        self._finish(CUT)

    def _finish(self, outcome: str) -> None:
        if self.outcome is not None:
            return
        self.outcome = outcome
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.upstream.on_data = self.upstream.on_lost = None
        self._finished(self, outcome)

    def _on_data(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        try:
            used = self.framing.feed(data)
        except FramingError:
            self._finish(CUT if self._forwarded else HAND_OVER)
            return
        part = data if used == len(data) else data[:used]
        self._extra = self._extra or used < len(data)
        if not self._forwarded:
            self._held += part
            status = self.framing.status
            if status == 0 or (status == 404 and self._held_as_404()):
                return
            self._forwarded = True
            part = bytes(self._held)
            self._held.clear()
            if self._marks_no_retry and status in NO_RETRY_STATUSES:
                part = with_no_retry(part)
        self.client.send(part)
        if self._tap is not None:
            self._tap.seen(part)
        if self.framing.done:
            self._finish(ANSWERED)

    def _held_as_404(self) -> bool:
        """A 404 is small: it is held whole, to tell the engine's web framework's route miss
        (answered as a 501 that names the engine) from the engine's own 404 (passed on). True
        while it is held, and once it is answered."""
        framing = self.framing
        if self._route_miss is None:
            return False
        if framing.chunked or len(self._held) > framing.head_bytes + ROUTE_MISS_BYTES:
            return False
        if not framing.done:
            return True
        if not is_route_miss(bytes(self._held[framing.head_bytes :])):
            return False
        self._held.clear()
        self._forwarded = True
        self.client.send(self._route_miss())
        self._finish(ANSWERED)
        return True

    def _on_lost(self) -> None:
        if self._forwarded and self.framing.closed():
            self._finish(ANSWERED)
        elif not self._forwarded and not self._held and self.framing.status == 0:
            self._finish(RETRY)
        else:
            self._finish(CUT if self._forwarded else HAND_OVER)

    def _watch(self) -> None:
        # One timer per request, not one per chunk: it re-arms for what is left of the bound.
        bound = self._read_timeout_s
        quiet = self._loop.time() - self._last_read
        if quiet < bound:
            self._watchdog = self._loop.call_later(bound - quiet, self._watch)
            return
        if not self._forwarded:
            message = f"deployment {self.deployment} did not answer within {bound:.0f} s"
            self.client.send(error_bytes(502, message, "bad_gateway", deployment=self.deployment))
        self._extra = True  # the engine may still answer: never reuse the socket
        self._finish(ANSWERED if not self._forwarded else CUT)


_NO_RETRY_LINE = f"{NO_RETRY}: false\r\n".encode()


def with_no_retry(answer: bytes) -> bytes:
    """The engine's answer (its whole head in hand) with `x-should-retry: false` after the
    status line, as the application's relay adds it (relay.no_retry_headers)."""
    line_end = answer.find(b"\r\n") + 2
    return answer[:line_end] + _NO_RETRY_LINE + answer[line_end:]


def upstream_request(
    head: RequestHead, body: bytes, backend: Backend, host_header: str, prefix: str
) -> bytes:
    """The request the engine gets: the client's target under the engine's path prefix, with
    the headers the application's relay sends too (relay.engine_headers)."""
    headers = engine_headers(lambda name: head.header(name.lower()), backend)
    headers["Content-Length"] = str(len(body))
    lines = [f"{head.method} {prefix}{head.target} HTTP/1.1", f"Host: {host_header}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
