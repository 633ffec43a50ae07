"""Kept-alive raw connections from the gateway's fast path to the engines: a request goes out
as one write, and the answer's bytes are handed to whoever holds the connection as they
arrive, with no HTTP client in between. An engine is reached over TCP (host, port) or, when
sm120's ward holds its port, over its unix socket (a path)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

# A backend that is down refuses at once; one that is wedged must not hang the client.
CONNECT_TIMEOUT_S = 3.0
# uvicorn (vLLM's and SGLang's server) drops a connection idle for 5 s: one idle longer than
# this is not used again, so a request never lands on a socket the engine is closing.
POOL_IDLE_S = 3.0

# (host, port) over TCP, or a unix socket's path.
Address = tuple[str, int] | str


class UpstreamConnection(asyncio.Protocol):
    """One socket to an engine. Its owner sets `on_data` and `on_lost` while a request is out."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.on_data: Callable[[bytes], None] | None = None
        self.on_lost: Callable[[], None] | None = None
        self.idle_since = time.monotonic()
        self.used = False  # a request went out on it before the one now out
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's: the protocol is what they share.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.on_data is not None:
            self.on_data(data)
        elif self.transport is not None:
            # Bytes nobody asked for (an idle socket): it cannot be trusted for a request.
            self.transport.abort()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.on_lost is not None:
            self.on_lost()

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        self.on_data = self.on_lost = None
        if self.transport is not None and not self.lost:
            self.transport.abort()


class UpstreamPool:
    """Idle connections per engine address, reused while younger than POOL_IDLE_S."""

    def __init__(self) -> None:
        self._idle: dict[Address, list[UpstreamConnection]] = {}

    def take_idle(self, address: Address) -> UpstreamConnection | None:
        idle = self._idle.get(address)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.lost and now - connection.idle_since < POOL_IDLE_S:
                connection.used = True
                return connection
            connection.close()
        return None

    async def connect(self, address: Address) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        if isinstance(address, str):
            opening = loop.create_unix_connection(lambda: UpstreamConnection(address), address)
        else:
            host, port = address
            opening = loop.create_connection(lambda: UpstreamConnection(address), host, port)
        _, connection = await asyncio.wait_for(opening, CONNECT_TIMEOUT_S)
        return connection

    def give_back(self, connection: UpstreamConnection) -> None:
        connection.on_data = connection.on_lost = None
        if connection.lost:
            return
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.address, []).append(connection)

    def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()


def engine_address(base_url: str) -> tuple[tuple[str, int], str, str] | None:
    """(host and port to connect to, the Host header, the path prefix) of a plain-HTTP
    engine URL; None for anything else (https, no host), which the full server relays."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    return (parts.hostname, port), parts.netloc, parts.path.rstrip("/")
