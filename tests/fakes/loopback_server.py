"""The shell the scripted test servers share: a stdlib HTTP server on a free loopback port,
served from a daemon thread, started and stopped as a context manager."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar

_Server = TypeVar("_Server", bound="LoopbackServer")


class LoopbackServer:
    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler],
        server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer,
        *,
        address: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        self._httpd = server_class(address, handler)
        self._httpd.daemon_threads = True
        # A short poll keeps stop() quick: shutdown waits for the next poll.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def serve_forever(self) -> None:
        """Serve in this thread until the process ends (for a fake run as its own process)."""
        self._httpd.serve_forever(poll_interval=0.05)

    def start(self: _Server) -> _Server:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self: _Server) -> _Server:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
