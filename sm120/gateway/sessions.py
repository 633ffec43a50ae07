"""The aiohttp client sessions the gateway's application reaches engines with (the relay, the
swap actions): one over TCP for every engine that listens on host:port, and one per unix
socket for the warded engines (Backend.socket), made on first use and kept, since a session
holds its kept-alive connections. The URL stays the backend's base_url over either, so an
engine gets the same Host header on its socket as on its port."""

from __future__ import annotations

import aiohttp

from sm120.gateway.backends import Backend


def client_session(connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
    """A session as the relay needs one: answers passed on as sent (no decompression), and
    no cookie jar (nothing upstream sets cookies, and each request would pay the lookup)."""
    return aiohttp.ClientSession(
        connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
    )


class EngineSessions:
    """The TCP session handed in (its owner closes it) and a session per engine socket
    (closed by `close`)."""

    def __init__(self, tcp: aiohttp.ClientSession) -> None:
        self.tcp = tcp
        self._by_socket: dict[str, aiohttp.ClientSession] = {}

    def for_backend(self, backend: Backend) -> aiohttp.ClientSession:
        if backend.socket is None:
            return self.tcp
        session = self._by_socket.get(backend.socket)
        if session is None or session.closed:
            # No pool limit: every streamed answer holds its connection until it ends.
            connector = aiohttp.UnixConnector(path=backend.socket, limit=0)
            session = self._by_socket[backend.socket] = client_session(connector)
        return session

    @property
    def sockets(self) -> list[str]:
        """The sockets a session is open for (what `close` will close)."""
        return [path for path, session in self._by_socket.items() if not session.closed]

    async def close(self) -> None:
        sessions, self._by_socket = list(self._by_socket.values()), {}
        for session in sessions:
            await session.close()


def engine_sessions(given: aiohttp.ClientSession | EngineSessions) -> EngineSessions:
    """The sessions of `given`: itself, or a plain TCP session wrapped (the socket sessions
    the wrapper makes are then closed with the application, see proxy.build_app)."""
    return given if isinstance(given, EngineSessions) else EngineSessions(given)
