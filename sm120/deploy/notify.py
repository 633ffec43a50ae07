"""The systemd notify protocol, enough for Type=notify: READY=1 and STOPPING=1.

A datagram to $NOTIFY_SOCKET (a path, or an abstract socket written with a leading '@');
without that variable nothing was asked for, and nothing is sent.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send `message` to the service manager; False when not run under one."""
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode())
    return True
