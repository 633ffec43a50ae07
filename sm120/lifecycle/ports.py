"""Is the port free? Checked before anything starts, so a clash costs nothing."""

from __future__ import annotations

import socket

from sm120.errors import SM120Error


class PortInUse(SM120Error):
    """Something already listens on the port."""


def ensure_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the server binds (uvicorn sets SO_REUSEADDR): connections a stopped server left
        # in TIME_WAIT do not block it, only a socket still listening does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"port {port} on {host} is already in use ({exc.strerror})",
                "pick another with --port, or 'sm120 status' / 'sm120 stop' if it is ours",
            ) from None
