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
import json
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from sm120.gateway import proxy
from sm120.gateway.admission import Ticket, refusal_bytes
from sm120.gateway.backends import Backend
from sm120.gateway.exchange import ANSWERED, CUT, HAND_OVER, RETRY, Exchange, upstream_request
from sm120.gateway.keys import KeyEntry
from sm120.gateway.limits import Refusal
from sm120.gateway.relay import BODY_READ_TIMEOUT_S, error_bytes, route_miss_message
from sm120.gateway.upstream import UpstreamConnection, UpstreamPool, engine_address
from sm120.gateway.wire import HEAD_END, MAX_HEAD_BYTES, RequestHead, parse_request_head
from sm120.recipe.endpoints import protocol_paths

# Where the full application listens: an abstract unix socket name, or (host, port).
Internal = str | tuple[str, int]


@dataclass(frozen=True)
class Route:
    backend: Backend
    request: bytes  # what the engine gets, head and body
    address: tuple[str, int]
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
        self.hot_paths = {path: name for name, path in protocol_paths().items()}
        self.connections: set[FrontConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.counts = app[proxy.FAST_PATH]
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
        if served != model or self.rewrite is not None:
            # An alias must reach the engine under the name it serves; the body is sent anew.
            changed = {**parsed, "model": served}
            rewritten = self.rewrite(head.path, changed) if self.rewrite else changed
            body = json.dumps(rewritten).encode()
        address, host_header, prefix = target
        request = upstream_request(head, body, backend, host_header, prefix)
        return Route(backend, request, address, head.path, protocol, served, parsed)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        # Held until done: the loop keeps only a weak reference to a task.
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def connection(self) -> FrontConnection:
        return FrontConnection(self)

    async def open_internal(self, client: FrontConnection) -> asyncio.Transport:
        loop = asyncio.get_running_loop()
        if isinstance(self.internal, str):
            # Connected by hand: uvloop's create_unix_connection refuses abstract names.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, self.internal)
            except OSError:
                sock.close()
                raise
            transport, _ = await loop.create_unix_connection(
                lambda: InternalSide(client), sock=sock
            )
        else:
            host, port = self.internal
            transport, _ = await loop.create_connection(lambda: InternalSide(client), host, port)
        return transport

    def close(self) -> None:
        for connection in list(self.connections):
            connection.abort()
        for task in list(self.tasks):
            task.cancel()
        self.pool.close()


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


class InternalSide(asyncio.Protocol):
    """The application's end of a connection handed over: its bytes go to the client."""

    def __init__(self, client: FrontConnection) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.send(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close_after_writes()

    def pause_writing(self) -> None:
        self.client.pause_reading()

    def resume_writing(self) -> None:
        self.client.resume_reading()


class FrontConnection(asyncio.Protocol):
    """One client connection: its requests one at a time (pipelined ones wait in the buffer),
    each on the fast path until the first one it hands over; from then on the connection is
    piped whole to the application."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.state = "head"  # "head", "body", "busy", "handed over", "closed"
        self._timer: asyncio.TimerHandle | None = None
        self._head: RequestHead | None = None
        self._body_at = 0
        self._request = b""  # the request as the client sent it, while it is served
        self._counted: Backend | None = None  # in the swapper's in-flight count
        self._exchange: Exchange | None = None
        self._internal: asyncio.Transport | None = None
        self._engine_closes = False
        self._entry: KeyEntry | None = None  # whose request is being served
        self._ticket: Ticket | None = None  # its admission, until it is recorded
        self._waiting: asyncio.Future[None] | None = None  # a wait for its turn

    # --- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's: the protocol is what they share.
        self.transport = cast(asyncio.Transport, transport)
        self.front.connections.add(self)
        self._wait_for_head()

    def data_received(self, data: bytes) -> None:
        if self.state == "handed over":
            if self._internal is not None:
                self._internal.write(data)
            else:
                self.buffer += data
            return
        self.buffer += data
        if self.state == "head":
            self._next_request()
        elif self.state == "body":
            self._body_arrived()
        elif len(self.buffer) > proxy.MAX_BODY_BYTES + MAX_HEAD_BYTES:
            self.pause_reading()  # pipelined requests wait; memory stays bounded

    def eof_received(self) -> bool:
        if self.state == "handed over" and self._internal is not None:
            # The client is done sending; the application may still be answering.
            if self._internal.can_write_eof():
                self._internal.write_eof()
            return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = "closed"
        self.front.connections.discard(self)
        self._cancel_timer()
        if self._waiting is not None and not self._waiting.done():
            self._waiting.cancel()  # out of its key's queue; its counts are taken back
            self._ticket = None
        if self._exchange is not None:
            self._exchange.cut()
        if self._internal is not None:
            self._internal.close()

    def pause_writing(self) -> None:
        reader = self._reading_from()
        if reader is not None:
            reader.pause_reading()

    def resume_writing(self) -> None:
        reader = self._reading_from()
        if reader is not None:
            reader.resume_reading()

    def _reading_from(self) -> asyncio.Transport | None:
        if self._exchange is not None:
            return self._exchange.upstream.transport
        return self._internal

    # --- what the other ends call -----------------------------------------------------------
    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

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

    # --- reading a request ------------------------------------------------------------------
    def _wait_for_head(self) -> None:
        self.state = "head"
        # A connection that sends no whole head this long after it opened or after its last
        # answer is closed: idle and slow-header connections cannot pile up.
        self._set_timer(proxy.IDLE_CONNECTION_S, self._idle_expired)
        self.resume_reading()
        if self.buffer:
            self._next_request()

    def _next_request(self) -> None:
        found = self.buffer.find(HEAD_END)
        if found < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                self._hand_over()
            return
        head = parse_request_head(bytes(self.buffer[:found]))
        entry = None if head is None else self.front.takes(head)
        if head is None or entry is None:
            self._hand_over()
            return
        self._entry = entry
        self._head, self._body_at = head, found + len(HEAD_END)
        self.state = "body"
        self._set_timer(BODY_READ_TIMEOUT_S, self._body_expired)
        self._body_arrived()

    def _body_arrived(self) -> None:
        head = self._head
        assert head is not None and head.content_length is not None
        end = self._body_at + head.content_length
        if len(self.buffer) < end:
            return
        self._cancel_timer()
        self._request = bytes(self.buffer[:end])
        del self.buffer[:end]
        self.state = "busy"
        assert self._entry is not None
        self._route(head, self._request[self._body_at :], self._entry)

    def _idle_expired(self) -> None:
        if self.state == "head":
            self.close_after_writes()

    def _body_expired(self) -> None:
        if self.state == "body":
            message = f"request body not received within {BODY_READ_TIMEOUT_S:.0f} s"
            self.send(error_bytes(408, message, "timeout"))
            self.close_after_writes()

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
        if isinstance(ticket, Refusal):
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

    def _refuse(self, route: Route, refusal: Refusal, entry: KeyEntry) -> None:
        self.front.team.refusal_recorded(entry, route.served, route.protocol, 429)
        self.send(refusal_bytes(route.protocol, refusal, entry.name))
        self._finish(ANSWERED)

    def _go(self, route: Route) -> None:
        swapper = self.front.swapper
        swapper.used(route.backend)
        swapper.in_flight[route.backend.deployment] += 1
        self._counted = route.backend
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

    def _finish(self, outcome: str) -> None:
        if self._counted is not None:
            self.front.swapper.in_flight[self._counted.deployment] -= 1
            self._counted = None
            self.front.routes.renew_if_stale()
        if self._ticket is not None:
            ticket, self._ticket = self._ticket, None
            if outcome in (HAND_OVER, RETRY):
                self.front.team.withdraw(ticket)  # the application admits it anew
            else:
                # A client gone before the answer's head is 499, as nginx logs it.
                self.front.team.finish(ticket, ticket.tap.status or 499)
        if self.state == "closed":
            return
        head = self._head
        if outcome == ANSWERED:
            self.front.counts.answered += 1
        if outcome == HAND_OVER:
            self._hand_over(self._request)
        elif outcome == CUT or self._engine_closes or (head and head_says_close(head)):
            self.close_after_writes()
        else:
            self._request = b""
            # Called from the engine socket's callback: the next pipelined request starts
            # on the next turn of the loop, not inside it.
            asyncio.get_running_loop().call_soon(self._wait_for_head)

    # --- handing over -----------------------------------------------------------------------
    def _hand_over(self, request: bytes = b"") -> None:
        """From now on this connection is piped to the application, starting with `request`
        (a request the fast path read but did not send on) and whatever the client sent."""
        self.state = "handed over"
        self.front.counts.handed_over += 1
        self._cancel_timer()
        self.buffer[:0] = request
        self._request = b""
        self.front.spawn(self._pipe_to_application())

    async def _pipe_to_application(self) -> None:
        try:
            internal = await self.front.open_internal(self)
        except OSError:
            self.send(error_bytes(503, "the gateway is shutting down", "service_unavailable"))
            self.close_after_writes()
            return
        if self.state == "closed":
            internal.close()
            return
        self._internal = internal
        internal.write(bytes(self.buffer))
        self.buffer.clear()
        self.resume_reading()


def head_says_close(head: RequestHead) -> bool:
    return "close" in (head.header("connection") or "").lower()
