"""The gateway's listening socket: a byte pipe with a switch in front.

A request an agent sends all day (a POST to a protocol path with the key and a JSON body
naming a model that runs) takes the fast path: its head is read here, it is sent on to the
engine over a kept-alive socket, and the engine's answer is copied back byte for byte, its
own framing included, with no HTTP server or client objects in between (sm120.gateway.exchange).
Everything else (a wrong key, an unknown model, a swap, a sleeping engine, the dashboard, a
malformed request) is piped whole to the full aiohttp application on an internal socket
(sm120.gateway.proxy.build_app), which answers it exactly as it did when it listened itself.
The fast path never answers differently from that application: where it would have to decide
anything but "send it on", it hands the request over, and the connection with it.

Why: aiohttp's server and client on the request path cost 0.68 ms of first-token time on an
H200 (TTFT 1.038 against the engine direct, benchmarks/results/gateway-overhead.md). The pipe
costs about a third of that (benchmarks/proxy_hop.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from sm120.gateway import proxy
from sm120.gateway.absorb import absorb, rewrites
from sm120.gateway.access_log import HandedOver, RequestRecord, address_text
from sm120.gateway.admission import Ticket, refusal_bytes
from sm120.gateway.backends import Backend
from sm120.gateway.exchange import ANSWERED, CUT, HAND_OVER, RETRY, Exchange, upstream_request
from sm120.gateway.keys import KeyEntry
from sm120.gateway.limits import Refusal as LimitRefusal
from sm120.gateway.relay import BODY_READ_TIMEOUT_S, error_bytes, route_miss_message
from sm120.gateway.upstream import Address, UpstreamConnection, UpstreamPool, engine_address
from sm120.recipe.endpoints import protocol_paths
from sm120.server.framing import RequestHead
from sm120.server.request_reader import Refusal, Request, RequestReader

# Where the full application listens: an abstract unix socket name, or (host, port).
Internal = str | tuple[str, int]
# The internal pool's one key: every application socket goes to the same place.
INTERNAL_ADDRESS = ("application", 0)
# Open client connections at once. Each holds a parser and up to a request head (64 KiB)
# before it is whole: 12,000 idle connections holding unterminated heads once took the
# gateway from 61 to 552 MB. Agents keep a few connections each.
MAX_CONNECTIONS = 1024
# Whole requests a client may have sent ahead of their answers before its socket is no
# longer read (pipelining).
MAX_PIPELINED = 16
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# After this many connections at once, their closing hands freed memory back to the system.
TRIM_AFTER_CONNECTIONS = 256
# Headers about one hop's connection or framing: the application gets the request framed
# anew (a Content-Length for the body as read).
_HOP_REQUEST_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "expect", "upgrade",
     "te", "trailer", "proxy-connection"}
)  # fmt: skip


@dataclass(frozen=True)
class Route:
    backend: Backend
    request: bytes  # what the engine gets, head and body
    address: Address  # (host, port), or a warded engine's unix socket
    path: str
    protocol: str
    served: str  # the model the engine serves it as
    parsed: dict[str, Any]  # the body as the client sent it (for the opt-in request log)

    def route_miss(self) -> bytes:
        message = route_miss_message(self.backend, self.path, self.protocol)
        return error_bytes(501, message, "not_implemented", deployment=self.backend.deployment)


class Front:
    """What every client connection shares: the application's routing, the key, the pool."""

    def __init__(self, app: web.Application, api_key: str, internal: Internal) -> None:
        self.app = app
        self.internal = internal
        self.routes = app[proxy.ROUTES]
        self.swapper = app[proxy.SWAPPER]
        self.aliases = app[proxy.ALIASES]
        self.rewrite = app[proxy.REWRITE]
        self.pool = UpstreamPool()
        self.internal_pool = UpstreamPool()
        self.hot_paths = {path: name for name, path in protocol_paths().items()}
        self.connections: set[FrontConnection] = set()
        self._peak = 0  # the most connections open at once since memory was last released
        self.tasks: set[asyncio.Task[None]] = set()
        self.counts = app[proxy.FAST_PATH]
        self.access = app[proxy.ACCESS_LOG]  # None: no access log
        self.handed = app[proxy.HANDED_OVER]
        self.port = 0  # where it listens, once it does
        self.team = app[proxy.TEAM]

    def takes(self, head: RequestHead) -> KeyEntry | None:
        """Whose request this is, when the fast path may try it; None: the application
        answers it (a wrong, expired or doubled key is its 401)."""
        length = head.content_length
        if not (
            head.method == "POST"
            and head.path in self.hot_paths
            and length is not None
            and 0 < length <= proxy.MAX_BODY_BYTES
            and not head.has("transfer-encoding")
            and not head.has("expect")
        ):
            return None
        who = self.team.identify(head.headers)
        return who if isinstance(who, KeyEntry) else None

    def route(
        self, head: RequestHead, body: bytes, parsed: dict[str, Any], model: str,
        served: str, backend: Backend | None, entry: KeyEntry,
    ) -> Route | None:  # fmt: skip
        """The engine request for a routed model, or None where the application must answer
        (not running, a protocol its engine lacks, asleep, not plain HTTP, not the key's)."""
        if backend is None or not backend.running or not self.swapper.awake(backend):
            return None
        if not entry.allows(served):
            return None
        protocol = self.hot_paths[head.path]
        if backend.protocols is not None and backend.protocols.known_not_to_serve(protocol):
            return None
        target = engine_address(backend.base_url)
        if target is None:
            return None
        fixing = rewrites(backend.fixes, head.path, parsed)
        if served != model or self.rewrite is not None or fixing:
            # An alias must reach the engine under the name it serves; the body is sent anew.
            changed = {**parsed, "model": served}
            rewritten = self.rewrite(head.path, changed) if self.rewrite else changed
            if fixing:
                absorbed = absorb(rewritten, head.path, backend.fixes, backend.deployment)
                if absorbed.refusal is not None:
                    return None  # the application answers it, and says why
                rewritten = absorbed.body
            body = json.dumps(rewritten).encode()
        address, host_header, prefix = target
        request = upstream_request(head, body, backend, host_header, prefix)
        # A warded engine is reached on its socket, with the Host header its URL gives.
        where = backend.socket or address
        return Route(backend, request, where, head.path, protocol, served, parsed)

    def connection_closed(self, connection: FrontConnection) -> None:
        connections = self.connections
        connections.discard(connection)
        self._peak = max(self._peak, len(connections) + 1)
        if self._peak >= TRIM_AFTER_CONNECTIONS and len(connections) <= self._peak // 8:
            # A flood of connections is over: their heads were large allocations glibc keeps
            # in the heap after they are freed; hand them back so the gateway does not stay
            # at the flood's size.
            self._peak = len(connections)
            release_freed_memory()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        # Held until done: the loop keeps only a weak reference to a task.
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def connection(self) -> FrontConnection:
        return FrontConnection(self)

    async def open_internal(self) -> InternalConnection:
        """A new socket to the application."""
        loop = asyncio.get_running_loop()
        handed = self.handed
        if isinstance(self.internal, str):
            # Connected by hand: uvloop's create_unix_connection refuses abstract names.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            # Autobound to an abstract name of its own (Linux): the application's access log
            # finds each request's client by it (access_log.HandedOver); elsewhere it says '-'.
            name: object = None
            with contextlib.suppress(OSError):
                sock.bind("")
                name = sock.getsockname()
            try:
                await loop.sock_connect(sock, self.internal)
                _, connection = await loop.create_unix_connection(
                    lambda: InternalConnection(handed, name), sock=sock
                )
            except OSError:
                sock.close()
                raise
            return connection
        host, port = self.internal
        transport, connection = await loop.create_connection(
            lambda: InternalConnection(handed, None), host, port
        )
        connection.name = transport.get_extra_info("sockname")
        return connection

    def close(self) -> None:
        for connection in list(self.connections):
            connection.abort()
        for task in list(self.tasks):
            task.cancel()
        self.pool.close()
        self.internal_pool.close()


@contextlib.asynccontextmanager
async def serving_front(
    app: web.Application, api_key: str, internal: Internal, host: str, port: int
) -> AsyncIterator[Front]:
    """The front listening on host:port (0: any free port) for as long as the block runs."""
    front = Front(app, api_key, internal)
    server = await asyncio.get_running_loop().create_server(front.connection, host, port)
    front.port = server.sockets[0].getsockname()[1]
    try:
        yield front
    finally:
        server.close()
        front.close()
        await server.wait_closed()


class InternalConnection(UpstreamConnection):
    """A socket to the application. It carries one client's request at a time: while it
    does, the application's access log reads that client's address by this socket's name."""

    def __init__(self, handed: HandedOver, name: object) -> None:
        super().__init__(INTERNAL_ADDRESS)
        self.handed = handed
        self.name = name

    def serving(self, client: str) -> None:
        if self.name is not None:
            self.handed.add(self.name, client)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.name is not None:
            self.handed.discard(self.name)
        super().connection_lost(exc)


class FrontConnection(asyncio.Protocol):
    """One client connection. Every byte the client sends goes through one strict parser
    (sm120.server.request_reader); its requests are served one at a time in the order sent, each on
    the fast path where it can be, else by the application over an internal socket, the
    application's answer followed to its end as an engine's is. A request that does not parse
    is answered here and ends the connection."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.reader = RequestReader(proxy.MAX_BODY_BYTES)
        self.state = "idle"  # "idle", "busy" (a request is being answered), "closed"
        self._timer: asyncio.TimerHandle | None = None
        self._request: Request | None = None  # the request being answered
        self._counted: Backend | None = None  # in the swapper's in-flight count
        self._exchange: Exchange | None = None
        self._client_done = False  # the client closed its sending side
        self._continued = False  # 100 Continue sent for the request being read
        self._engine_closes = False
        self._refused = False
        self.peer = "-"
        self._record: RequestRecord | None = None  # the access log's line for this request
        self._ticket: Ticket | None = None  # its admission, until it is recorded
        self._waiting: asyncio.Future[None] | None = None  # a wait for its turn

    # --- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's: the protocol is what they share.
        self.transport = cast(asyncio.Transport, transport)
        self.peer = address_text(transport.get_extra_info("peername"))
        if len(self.front.connections) >= MAX_CONNECTIONS:
            # Each open connection holds a parser and up to a head's bytes: past the bound a
            # flood of idle connections is refused rather than held.
            self._own_answer(error_bytes(503, "the gateway has too many open connections",
                                         "overloaded", close=True))  # fmt: skip
            self.close_after_writes()
            self.state = "closed"
            return
        self.front.connections.add(self)
        self._idle()

    def data_received(self, data: bytes) -> None:
        if self.state == "closed":
            return
        reader = self.reader
        reader.feed(data)
        if reader.continue_wanted and not self._continued:
            self._continued = True
            self.send(CONTINUE)
        if reader.in_body and not self._continued and self.state == "idle":
            self._set_timer(BODY_READ_TIMEOUT_S, self._body_expired)
        if len(reader.out) >= MAX_PIPELINED or reader.body_bytes > proxy.MAX_BODY_BYTES:
            self.pause_reading()  # pipelined requests wait; memory stays bounded
        if self.state == "idle":
            self._serve_next()

    def eof_received(self) -> bool:
        exchange = self._exchange
        if exchange is not None and exchange.forwarded:
            # The end of the client's side while an answer streams to it: a client that went
            # away (one that only half-closed sent its request and shut its side then, not
            # midway through an answer). Closing the engine's socket stops its generation.
            exchange.cut()
            return False
        # A half-close: the client sent all it will send, and still reads the answers.
        self._client_done = True
        self.reader.eof()
        if self.state == "idle":
            self._serve_next()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = "closed"
        if self._waiting is not None and not self._waiting.done():
            self._waiting.cancel()  # out of its key's queue; its counts are taken back
            self._ticket = None
        self.reader.close()
        self.front.connection_closed(self)
        self._cancel_timer()
        if self._exchange is not None:
            self._exchange.cut()
        self._uncount()

    def pause_writing(self) -> None:
        if self._exchange is not None and self._exchange.upstream.transport is not None:
            self._exchange.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self._exchange is not None and self._exchange.upstream.transport is not None:
            self._exchange.upstream.transport.resume_reading()

    # --- what the other ends call -----------------------------------------------------------
    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            record = self._record
            if record is not None:  # inline: this runs once per chunk of every answer
                if record.first_byte is None:
                    record.first_bytes(data)
                record.sent += len(data)

    def _own_answer(self, answer: bytes, method: str = "-", path: str = "-") -> None:
        """An answer of the front's own (a refusal, a bound): sent, and logged as such."""
        if self.front.access is not None:
            self._record = RequestRecord(self.peer, method, path, "front")
        self.send(answer)
        self._log(ANSWERED)

    def close_after_writes(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if self.transport is not None and self.transport.is_reading():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_reading():
            self.transport.resume_reading()

    # --- between requests -------------------------------------------------------------------
    def _idle(self) -> None:
        self.state = "idle"
        self._request = None
        self._continued = False
        # A connection that sends no whole request this long after it opened or after its
        # last answer is closed: idle and slow-header connections cannot pile up.
        if self.reader.in_body:
            self._set_timer(BODY_READ_TIMEOUT_S, self._body_expired)
        else:
            self._set_timer(proxy.IDLE_CONNECTION_S, self._idle_expired)
        self.resume_reading()
        self._serve_next()

    def _serve_next(self) -> None:
        item = self.reader.take()
        if item is None:
            if self._client_done and not self.reader.out:
                self.close_after_writes()  # nothing more will come: done once all is written
            return
        self._cancel_timer()
        self.state = "busy"
        if isinstance(item, Refusal):
            self._refused = True
            answer = error_bytes(item.status, item.message, "invalid_request_error", close=True)
            self._own_answer(answer)
            self.close_after_writes()
            return
        self._request = item
        entry = self.front.takes(item.head) if item.version == "1.1" else None
        if entry is not None:
            if self.front.access is not None:
                self._record = RequestRecord(self.peer, item.head.method, item.head.path, "fast")
            self._route(item.head, item.body, entry)
        else:
            self._to_application(item)

    def _idle_expired(self) -> None:
        if self.state == "idle":
            self.close_after_writes()

    def _body_expired(self) -> None:
        if self.state == "idle" and self.reader.in_body:
            message = f"request body not received within {BODY_READ_TIMEOUT_S:.0f} s"
            self._own_answer(error_bytes(408, message, "timeout", close=True))
            self.close_after_writes()
            self.state = "closed"

    def _set_timer(self, seconds: float, then: Callable[[], None]) -> None:
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(seconds, then)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # --- the fast path ----------------------------------------------------------------------
    def _route(self, head: RequestHead, body: bytes, entry: KeyEntry) -> None:
        """In the callback that read the request, when the routing table in hand answers;
        a task only when the state files must be read or a sleeping engine asked."""
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            parsed = None
        model = parsed.get("model") if isinstance(parsed, dict) else None
        if not isinstance(model, str) or not model or not isinstance(parsed, dict):
            self._finish(HAND_OVER)
            return
        if self._record is not None:
            self._record.model = model
        front = self.front
        cached = front.routes.cached(model, front.aliases)
        if cached is None or cached[1].sleep_mode:
            self.front.spawn(self._route_after_reading(head, body, parsed, model, entry))
            return
        try:
            route = front.route(head, body, parsed, model, *cached, entry)
        except Exception:  # e.g. the normaliser on an odd body: the application answers it
            route = None
        self._admit(route, entry)

    async def _route_after_reading(
        self, head: RequestHead, body: bytes, parsed: dict[str, Any], model: str,
        entry: KeyEntry,
    ) -> None:  # fmt: skip
        front = self.front
        try:
            served, backend, _ = await front.routes.route(model, front.aliases)
            if backend is not None and backend.sleep_mode:
                await front.swapper.observe({backend.model: backend})
            route = front.route(head, body, parsed, model, served, backend, entry)
        except Exception:  # the application answers, and says what went wrong
            route = None
        if self.state != "closed":
            self._admit(route, entry)

    def _admit(self, route: Route | None, entry: KeyEntry) -> None:
        """The key's limits and its turn on the deployment (sm120.gateway.admission), the
        same as the application's: a refusal is the same 429 it would send."""
        if route is None:
            self._finish(HAND_OVER)
            return
        team = self.front.team
        backend = route.backend
        ticket = team.admit(entry, backend.deployment, backend.max_num_seqs, route.served,
                            route.protocol, route.parsed)  # fmt: skip
        if isinstance(ticket, LimitRefusal):
            self._refuse(route, ticket, entry)
            return
        self._ticket = ticket
        if team.take_turn(ticket):
            self._go(route)
        else:
            self._waiting = asyncio.ensure_future(self._wait_turn(route, ticket, entry))
            self.front.tasks.add(self._waiting)
            self._waiting.add_done_callback(self.front.tasks.discard)

    async def _wait_turn(self, route: Route, ticket: Ticket, entry: KeyEntry) -> None:
        refusal = await self.front.team.wait_turn(ticket)
        self._waiting = None
        if self.state == "closed":
            self.front.team.withdraw(ticket)
            self._ticket = None
            return
        if refusal is not None:
            self._ticket = None
            self._refuse(route, refusal, entry)
        else:
            self._go(route)

    def _refuse(self, route: Route, refusal: LimitRefusal, entry: KeyEntry) -> None:
        self.front.team.refusal_recorded(entry, route.served, route.protocol, 429)
        self.send(refusal_bytes(route.protocol, refusal, entry.name))  # logged as the request's
        self._finish(ANSWERED)

    def _go(self, route: Route) -> None:
        swapper = self.front.swapper
        swapper.used(route.backend)
        swapper.in_flight[route.backend.deployment] += 1
        self._counted = route.backend
        if self._record is not None:
            self._record.deployment = route.backend.deployment
        upstream = self.front.pool.take_idle(route.address)
        if upstream is None:
            self.front.spawn(self._connect(route))
        else:
            self._exchange_on(upstream, route)

    async def _connect(self, route: Route) -> None:
        try:
            upstream = await self.front.pool.connect(route.address)
        except (OSError, asyncio.TimeoutError):
            self._finish(HAND_OVER)  # the application answers 502, naming the deployment
            return
        if self.state == "closed":
            upstream.close()
            self._finish(CUT)
            return
        self._exchange_on(upstream, route)

    def _exchange_on(self, upstream: UpstreamConnection, route: Route) -> None:
        def finished(exchange: Exchange, outcome: str) -> None:
            self._exchange = None
            if self._ticket is not None:
                self._ticket.tap.status = exchange.framing.status
            if exchange.reusable:
                self.front.pool.give_back(upstream)
            else:
                upstream.close()
            if outcome == RETRY and upstream.used:
                # A kept-alive socket the engine closed as the request went out: once more
                # on a new one (no byte of an answer was read).
                self.front.spawn(self._connect(route))
                return
            # An engine that closes after this answer said so in the head the client got.
            self._engine_closes = not exchange.framing.keep_alive
            self._finish(HAND_OVER if outcome == RETRY else outcome)

        tap = self._ticket.tap if self._ticket is not None else None
        self._exchange = Exchange(
            self, upstream, route.request, route.backend.deployment, route.route_miss, finished,
            tap,
        )  # fmt: skip

    def _uncount(self) -> None:
        if self._counted is not None:
            self.front.swapper.in_flight[self._counted.deployment] -= 1
            self._counted = None
            self.front.routes.renew_if_stale()

    def _finish(self, outcome: str) -> None:
        self._uncount()
        self._log(outcome)
        if self._ticket is not None:
            ticket, self._ticket = self._ticket, None
            if outcome in (HAND_OVER, RETRY):
                self.front.team.withdraw(ticket)  # the application admits it anew
            else:
                # A client gone before the answer's head is 499, as nginx logs it.
                self.front.team.finish(ticket, ticket.tap.status or 499)
        if self.state == "closed":
            return
        request = self._request
        if outcome == ANSWERED:
            self.front.counts.answered += 1
        if outcome == HAND_OVER and request is not None:
            self._to_application(request)
            return
        self._answered(outcome)

    def _answered(self, outcome: str) -> None:
        request = self._request
        closes = request is None or not request.keep_alive or request.version != "1.1"
        if outcome == CUT or self._engine_closes or closes:
            self.close_after_writes()
            self.state = "closed"
        else:
            # Called from the other socket's callback: the next pipelined request starts on
            # the next turn of the loop, not inside it.
            asyncio.get_running_loop().call_soon(self._idle)

    def _log(self, outcome: str) -> None:
        """The request's access-log line, unless the application answers (and logs) it."""
        record, self._record = self._record, None
        access = self.front.access
        if record is None or access is None or outcome == HAND_OVER:
            return
        if outcome == CUT:
            record.via += ",cut"
        access.finish(record)

    # --- the application --------------------------------------------------------------------
    def _to_application(self, request: Request) -> None:
        """`request`, parsed whole, to the application on an internal socket; its answer is
        copied back as it arrives and followed to its end, so the connection goes on."""
        self.front.counts.handed_over += 1
        upstream = self.front.internal_pool.take_idle(INTERNAL_ADDRESS)
        sent = application_request(request)
        assert upstream is None or isinstance(upstream, InternalConnection)
        if upstream is None:
            self.front.spawn(self._to_application_connected(request, sent))
        else:
            self._application_exchange(upstream, request, sent)

    async def _to_application_connected(self, request: Request, sent: bytes) -> None:
        try:
            upstream = await self.front.open_internal()
        except OSError:
            answer = error_bytes(503, "the gateway is shutting down", "service_unavailable",
                                 close=True)  # fmt: skip
            self._own_answer(answer, request.head.method, request.head.path)
            self.close_after_writes()
            return
        if self.state == "closed":
            upstream.close()
            return
        self._application_exchange(upstream, request, sent)

    def _application_exchange(
        self, upstream: InternalConnection, request: Request, sent: bytes
    ) -> None:
        upstream.serving(self.peer)

        def finished(exchange: Exchange, outcome: str) -> None:
            self._exchange = None
            if exchange.reusable:
                self.front.internal_pool.give_back(upstream)
            else:
                upstream.close()
            if outcome == RETRY and upstream.used:
                self.front.spawn(self._to_application_connected(request, sent))
                return
            if outcome in (HAND_OVER, RETRY):  # the application's answer could not be read
                answer = error_bytes(502, "the gateway failed to answer", "bad_gateway",
                                     close=True)  # fmt: skip
                self._own_answer(answer, request.head.method, request.head.path)
                outcome = CUT
            self._engine_closes = not exchange.framing.keep_alive
            self._answered(outcome)

        self._exchange = Exchange(
            self, upstream, sent, "", None, finished,
            bounded=False, head_request=request.head.method == "HEAD", marks_no_retry=False,
        )  # fmt: skip


def release_freed_memory() -> None:
    """glibc's malloc_trim where there is one (Linux); nothing elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def application_request(request: Request) -> bytes:
    """`request` as the application gets it: as parsed, framed anew with a Content-Length.
    An HTTP/1.0 request stays HTTP/1.0 (so the answer is framed for a 1.0 client) and closes."""
    head = request.head
    lines = [f"{head.method} {head.target} HTTP/{request.version}"]
    lines += [f"{name}: {value}" for name, value in head.headers
              if name not in _HOP_REQUEST_HEADERS]  # fmt: skip
    if request.body or head.method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(request.body)}")
    if request.version != "1.1":
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body
