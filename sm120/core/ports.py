"""Is the port free? Checked before anything starts, so a clash costs nothing."""

from __future__ import annotations

import errno
import socket

from sm120.core.errors import SM120Error
from sm120.core.net import is_ipv6


class PortInUse(SM120Error):
    """Something already listens on the port."""


class AddressUnusable(SM120Error):
    """The bind address is not one this machine has, or does not resolve."""


def ensure_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if is_ipv6(host) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the server binds (uvicorn sets SO_REUSEADDR): connections a stopped server left
        # in TIME_WAIT do not block it, only a socket still listening does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror as exc:
            raise AddressUnusable(
                f"cannot bind {host}: the name does not resolve ({exc.strerror})",
                "use an address of this machine, e.g. 127.0.0.1 or 0.0.0.0",
            ) from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(
                    f"port {port} on {host} is already in use ({exc.strerror})",
                    "pick another with --port, or 'sm120 status' / 'sm120 stop' if it is ours",
                ) from None
            raise AddressUnusable(
                f"cannot bind {host} port {port}: {exc.strerror}",
                "use an address of this machine (see 'ip addr'), e.g. 127.0.0.1 or 0.0.0.0",
            ) from None
