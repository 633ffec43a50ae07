"""The engine ward: sm120's own front on a deployment's TCP port, for an engine that listens
only on a unix socket in a 0700 folder (`vllm ... --uds`).

Why: vLLM's API key guards /v1 and a few other prefixes only. Every other route it registers
answers anyone who can reach its port: `POST /invocations` runs a completion without a key,
and an engine started for swaps (VLLM_SERVER_DEV_MODE=1) also answers `/collective_rpc`,
`/sleep` and the weight-update routes. On a box a team shares, every local user reaches
loopback. A warded engine has no TCP port at all; the ward holds the deployment's port and
passes the API routes (key-checked) and the probes (`/health`, `/metrics`, ...) and nothing
else. The gateway, being sm120 and this user, talks to the socket itself.

Every request is read by the gateway's strict parser (sm120.server.request_reader) and passed on
as one write over a kept-alive socket; the engine's answer is copied back byte for byte, its
own framing included (sm120.server.framing follows where it ends).

Usage: python -m sm120.engine.ward --host HOST --port PORT --socket PATH [--key-file FILE]
It prints one line, `ward listening on HOST:PORT`, once the port is held (the supervisor
waits for it), and runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import re
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sm120.engine.secrets import read_api_key
from sm120.recipe.endpoints import protocol_paths
from sm120.server.framing import FramingError, RequestHead, ResponseFraming
from sm120.server.request_reader import Refusal, Request, RequestReader

# The same bounds as the gateway's front: a request body, connections at once, how long a
# client may take to send a request it began, how long a kept-alive connection may idle.
MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_CONNECTIONS = 1024
REQUEST_READ_TIMEOUT_S = 60.0
IDLE_TIMEOUT_S = 120.0
SWEEP_INTERVAL_S = 5.0
# uvicorn (vLLM's server) drops a connection idle for 5 s: one idle longer than this is not
# used again, so a request never goes out on a socket the engine is closing.
UPSTREAM_IDLE_S = 3.0
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LISTENING = "ward listening on"

# Answered without a key: what probes and the monitor read (vLLM answers them unguarded too).
PROBES = frozenset({"/health", "/ping", "/metrics", "/version", "/load"})
# Headers about this hop's connection and framing: the engine gets the request framed anew.
_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "expect", "upgrade",
     "te", "trailer", "proxy-connection"}
)  # fmt: skip
# GET routes of the API besides the protocol paths: the model list and one model, a stored
# response; and a stored response's cancel.
_API_GETS = (re.compile(r"/v1/models(/[^/]+)?"), re.compile(r"/v1/responses/[^/]+"))
_API_POSTS = (re.compile(r"/v1/responses/[^/]+/cancel"),)


def route_kind(method: str, path: str) -> str:
    """ "probe" (passed, no key), "api" (passed with the key) or "closed" (answered 404 here)."""
    if method in ("GET", "HEAD") and path in PROBES:
        return "probe"
    if method == "POST" and (
        path in _protocol_paths() or any(p.fullmatch(path) for p in _API_POSTS)
    ):
        return "api"
    if method in ("GET", "HEAD") and any(p.fullmatch(path) for p in _API_GETS):
        return "api"
    if method == "DELETE" and _API_GETS[1].fullmatch(path):
        return "api"
    return "closed"


_PATHS: frozenset[str] | None = None


def _protocol_paths() -> frozenset[str]:
    global _PATHS
    if _PATHS is None:
        _PATHS = frozenset(protocol_paths().values())
    return _PATHS


def key_matches(head: RequestHead, key: str) -> bool:
    """Every credential the request carries is the key, and it carries one: two Authorization
    headers, or a right x-api-key beside a wrong Bearer, are refused (one credential a
    request, as at the gateway)."""
    given: list[str] = []
    for name, value in head.headers:
        if name == "authorization":
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer":
                return False
            given.append(token.strip())
        elif name == "x-api-key":
            given.append(value)
    if not given or len([name for name, _ in head.headers if name == "authorization"]) > 1:
        return False
    expected = key.encode()
    return all(hmac.compare_digest(token.encode("latin-1"), expected) for token in given)


def error_answer(status: int, message: str, path: str, *, close: bool = False) -> bytes:
    """An error in the shape of the protocol asked: Anthropic's for /v1/messages, OpenAI's
    otherwise."""
    kind = {401: "authentication_error", 404: "not_found_error", 503: "overloaded_error"}
    if path.startswith("/v1/messages"):
        payload = {"type": "error", "error": {"type": kind.get(status, "api_error"),
                                              "message": message}}  # fmt: skip
    else:
        payload = {"error": {"message": message, "type": kind.get(status, "invalid_request_error"),
                             "code": status}}  # fmt: skip
    body = json.dumps(payload).encode()
    reason = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 413: "Payload Too Large",
              431: "Request Header Fields Too Large", 503: "Service Unavailable"}  # fmt: skip
    head = [
        f"HTTP/1.1 {status} {reason.get(status, 'Error')}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "x-sm120-ward: refused",
    ]
    if status == 401:
        head.append("www-authenticate: Bearer")
    if status == 503:
        head.append("retry-after: 5")
    if close:
        head.append("connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def upstream_bytes(request: Request) -> bytes:
    """The request as the engine gets it: its own headers but this hop's, framed by length."""
    head = request.head
    lines = [f"{head.method} {head.target} HTTP/{request.version}"]
    lines += [f"{name}: {value}" for name, value in head.headers if name not in _HOP_HEADERS]
    if request.body or head.method in ("POST", "PUT", "PATCH"):
        lines.append(f"content-length: {len(request.body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body


@dataclass(frozen=True)
class WardConfig:
    host: str
    port: int
    socket: str
    key_file: str | None

    def key(self) -> str | None:
        # Read on each use: `sm120 keys`-style rotation of the deployment's key file takes
        # effect without a restart (one small read a request).
        return read_api_key(self.key_file) if self.key_file else None


class Ward:
    """What every client connection shares: the config, the open connections."""

    def __init__(self, config: WardConfig) -> None:
        self.config = config
        self.connections: set[ClientConnection] = set()
        self._key: tuple[float, str | None] = (0.0, None)
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        # Held until done: the loop keeps only a weak reference to a task.
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def key(self) -> str | None:
        # The file is read at most once a second: rotation shows within a second.
        read_at, key = self._key
        now = time.monotonic()
        if now - read_at > 1.0:
            key = self.config.key()
            self._key = (now, key)
        return key

    def refusal(self, head: RequestHead) -> bytes | None:
        """The ward's own answer to a request it does not pass; None: pass it on."""
        kind = route_kind(head.method, head.path)
        if kind == "closed":
            return error_answer(
                404, f"{head.path} is not served on this port: sm120's ward passes the API "
                "routes only (the engine's other routes answer nobody)", head.path)  # fmt: skip
        key = self.key()
        if kind == "api" and key is not None and not key_matches(head, key):
            return error_answer(401, "missing or wrong API key for this deployment", head.path)
        return None

    def sweep(self) -> None:
        now = time.monotonic()
        for connection in list(self.connections):
            connection.check_timeouts(now)


class Upstream(asyncio.Protocol):
    """One socket to the engine, carrying one request at a time for one client connection."""

    def __init__(self, owner: ClientConnection) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.owner.engine_data(self, data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.owner.engine_lost(self)

    def close(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.abort()


class ClientConnection(asyncio.Protocol):
    """One client connection: requests read whole by the strict parser, answered one at a
    time in the order sent, each passed to the engine or refused here."""

    def __init__(self, ward: Ward) -> None:
        self.ward = ward
        self.transport: asyncio.Transport | None = None
        self.reader = RequestReader(MAX_BODY_BYTES)
        self.upstream: Upstream | None = None
        self.framing: ResponseFraming | None = None
        self.request: Request | None = None
        self.sent_any = False  # a byte of the current answer reached the client
        self.retried = False
        self.closing = False
        self.client_done = False  # the client shut its write side
        self.continued = False
        self.last_activity = time.monotonic()

    # --- the client side ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if len(self.ward.connections) >= MAX_CONNECTIONS:
            self.transport.write(error_answer(503, "too many connections", "/", close=True))
            self.transport.close()
            return
        self.ward.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        self.reader.feed(data)
        if self.reader.continue_wanted and not self.continued and self.transport is not None:
            self.continued = True
            self.transport.write(CONTINUE)
        self._next()

    def eof_received(self) -> bool:
        # A half-close: the requests already sent are still answered, then the connection ends.
        self.client_done = True
        self.reader.eof()
        self._next()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.ward.connections.discard(self)
        self.reader.close()
        if self.upstream is not None:
            # Mid-answer: the engine sees the client go and stops the generation.
            self.upstream.close()
            self.upstream = None

    def pause_writing(self) -> None:
        # A slow client: stop reading the engine rather than hold its answer in memory.
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    def check_timeouts(self, now: float) -> None:
        if self.request is not None or self.transport is None:
            return  # an answer is on its way: the engine's pace is the client's business
        idle = now - self.last_activity
        if self.reader.in_message and idle > REQUEST_READ_TIMEOUT_S:
            self._refuse_and_close(408, "the request was not sent whole in time")
        elif not self.reader.in_message and idle > IDLE_TIMEOUT_S:
            self.transport.close()

    def _refuse_and_close(self, status: int, message: str) -> None:
        if self.transport is None or self.closing:
            return
        self.closing = True
        self.transport.write(error_answer(status, message, "/", close=True))
        self.transport.close()

    def _next(self) -> None:
        """Serve the next request read, unless one is being answered."""
        while self.request is None and not self.closing:
            item = self.reader.take()
            if item is None:
                if self.client_done and not self.reader.in_message and self.transport:
                    self.closing = True
                    self.transport.close()
                return
            if isinstance(item, Refusal):
                self._refuse_and_close(item.status, item.message)
                return
            self.continued = False
            refusal = self.ward.refusal(item.head)
            if refusal is not None:
                assert self.transport is not None
                self.transport.write(refusal)
                if not item.keep_alive:
                    self.closing = True
                    self.transport.close()
                continue
            self.request = item
            self.sent_any = False
            self.retried = False
            self.ward.spawn(self._send(item))

    # --- the engine side ----------------------------------------------------------------
    async def _send(self, request: Request) -> None:
        upstream = self.upstream
        if upstream is not None and (
            upstream.lost or time.monotonic() - upstream.idle_since > UPSTREAM_IDLE_S
        ):
            upstream.close()
            upstream = self.upstream = None
        if upstream is None:
            try:
                loop = asyncio.get_running_loop()
                _, upstream = await loop.create_unix_connection(
                    lambda: Upstream(self), self.ward.config.socket
                )
            except OSError:
                self._engine_unreachable(request)
                return
            if self.closing:
                upstream.close()
                return
            self.upstream = upstream
        self.framing = ResponseFraming(no_body=request.head.method == "HEAD")
        assert upstream.transport is not None
        upstream.transport.write(upstream_bytes(request))

    def _engine_unreachable(self, request: Request) -> None:
        if self.closing or self.transport is None:
            return
        message = "the engine is not answering yet (starting, or stopped): try again shortly"
        self.transport.write(error_answer(503, message, request.head.path))
        self._answer_done(request, reusable=False)

    def engine_data(self, upstream: Upstream, data: bytes) -> None:
        request, framing = self.request, self.framing
        if upstream is not self.upstream or request is None or framing is None:
            upstream.close()  # bytes nobody asked for: the socket cannot be trusted
            return
        try:
            used = framing.feed(data)
        except FramingError:
            upstream.close()
            self._cut()
            return
        if self.transport is not None and not self.closing:
            self.transport.write(data[:used] if used < len(data) else data)
            self.sent_any = True
        if framing.done:
            extra = used < len(data)
            if extra or not framing.keep_alive:
                upstream.close()
                self.upstream = None
            else:
                upstream.idle_since = time.monotonic()
            self._answer_done(request, reusable=framing.keep_alive)

    def engine_lost(self, upstream: Upstream) -> None:
        if upstream is not self.upstream:
            return
        self.upstream = None
        request, framing = self.request, self.framing
        if request is None or framing is None:
            return  # an idle socket the engine closed
        if framing.closed():  # an answer delimited by the close
            self._answer_done(request, reusable=False)
        elif not self.sent_any and not self.retried:
            # The engine closed a kept-alive socket as the request went out: once more on a
            # new one (nothing of an answer was seen, so nothing is doubled).
            self.retried = True
            self.ward.spawn(self._send(request))
        else:
            self._cut()

    def _cut(self) -> None:
        """Part of an answer went out and the rest never will: the client's framing would
        hang, so the connection ends (as the engine's own would)."""
        self.request = None
        if self.transport is not None and not self.closing:
            if not self.sent_any:
                self.transport.write(error_answer(502, "the engine closed the connection",
                                                  "/", close=True))  # fmt: skip
            self.closing = True
            self.transport.close()

    def _answer_done(self, request: Request, *, reusable: bool) -> None:
        self.request = None
        self.framing = None
        self.last_activity = time.monotonic()
        if not request.keep_alive or not reusable:
            if self.transport is not None and not self.closing:
                self.closing = True
                self.transport.close()
            return
        self._next()


async def serve(config: WardConfig, ready: Callable[[str], None]) -> None:
    """Hold config.host:config.port until cancelled."""
    ward = Ward(config)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ClientConnection(ward), config.host, config.port)
    port = server.sockets[0].getsockname()[1]  # config.port, or the free one 0 asked for
    ready(f"{LISTENING} {config.host}:{port}")
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SWEEP_INTERVAL_S)
            ward.sweep()
    finally:
        server.close()
        for connection in list(ward.connections):
            if connection.transport is not None:
                connection.transport.abort()


USAGE = "usage: python -m sm120.engine.ward --host H --port P --socket PATH [--key-file F]"
_OPTIONS = ("--host", "--port", "--socket", "--key-file")


# Its name as a module (`__name__` is "__main__" in the ward itself).
WARD_MODULE = "sm120.engine.ward"


def ward_argv(
    python: str, host: str, port: int, socket_path: str, key_file: str | None
) -> list[str]:
    """The command that starts a ward (the supervisor runs it beside the engine)."""
    argv = [python, "-m", WARD_MODULE, "--host", host, "--port", str(port)]
    argv += ["--socket", socket_path]
    return argv + (["--key-file", key_file] if key_file else [])


def parse_args(argv: list[str]) -> WardConfig:
    options: dict[str, str] = {}
    while len(argv) >= 2 and argv[0] in _OPTIONS:
        options[argv[0]] = argv[1]
        argv = argv[2:]
    if argv or not {"--host", "--port", "--socket"} <= set(options):
        raise SystemExit(USAGE)
    if not options["--port"].isdigit() or not 0 <= int(options["--port"]) < 65536:
        raise SystemExit(f"ward: --port must be a port from 0 (any free one) to 65535\n{USAGE}")
    return WardConfig(
        options["--host"], int(options["--port"]), options["--socket"], options.get("--key-file")
    )


def _run(main: Coroutine[Any, Any, None]) -> None:
    """uvloop where it is installed (as for the gateway): a byte pipe's cost is mostly the
    event loop's."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(sys.argv[1:] if argv is None else argv)
    Path(config.socket).parent.stat()  # the socket's folder exists (the launcher made it)

    def ready(line: str) -> None:
        print(line, flush=True)

    try:
        _run(serve(config, ready))
    except OSError as error:
        print(f"ward: cannot listen on {config.host}:{config.port}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
