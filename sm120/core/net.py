"""Bind addresses and the URLs that reach them, in one place.

An IPv6 address goes into a URL in brackets (http://[::1]:8000); a server bound to every
interface (0.0.0.0, ::) is reached from this machine over loopback.
"""

from __future__ import annotations

import ipaddress
import re

from sm120.core.errors import SM120Error

LOOPBACK_NAMES = ("localhost",)
EVERY_INTERFACE = ("0.0.0.0", "::")
# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
HOST_HINT = "use 127.0.0.1 (this machine only, the default) or 0.0.0.0 (every interface)"


class HostError(SM120Error):
    """A bind address that is neither an IP address nor a host name."""


def check_host(host: str, where: str = "--host") -> str:
    """The host as the engine should bind it; brackets around an IPv6 address are dropped."""
    if host == "":
        raise HostError(f"{where} is empty", HOST_HINT)
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if _ip(bare) is not None:
        return bare
    labels = bare.split(".")
    # A name's last label is never all digits (RFC 1123): 256.1.1.1 is a bad address.
    if (
        len(bare) <= 253
        and all(_LABEL.match(label) for label in labels)
        and not (labels[-1].isdigit())
    ):
        return bare
    shown = host if len(host) <= 60 else host[:57] + "..."
    raise HostError(f"{where} {shown!r} is not an IP address or host name", HOST_HINT)


def is_host(host: str) -> bool:
    """Whether check_host would take it (an empty host, from older state files, is too)."""
    if host == "":
        return True
    try:
        check_host(host)
    except HostError:
        return False
    return True


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_ipv6(host: str) -> bool:
    return isinstance(_ip(host), ipaddress.IPv6Address)


def is_loopback(host: str) -> bool:
    address = _ip(host)
    return host in LOOPBACK_NAMES if address is None else address.is_loopback


def is_every_interface(host: str) -> bool:
    return host in EVERY_INTERFACE or host == ""


def reachable_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to host."""
    if is_every_interface(host):
        return "::1" if host == "::" else "127.0.0.1"
    return host


def http_url(host: str, port: int, path: str = "") -> str:
    """http://HOST:PORT/PATH with an IPv6 address in brackets, as URLs need it, and the
    `%` before a zone id written `%25` (RFC 6874: http://[fe80::1%25eth0]:8000)."""
    shown = f"[{host.replace('%', '%25')}]" if is_ipv6(host) else host
    return f"http://{shown}:{port}{path}"


def client_url(host: str, port: int, path: str = "") -> str:
    """The URL a client on this machine uses for a server bound to host. httpx hands the
    host to the resolver as written, so a zone id keeps its bare `%` here."""
    reached = reachable_host(host)
    shown = f"[{reached}]" if is_ipv6(reached) else reached
    return f"http://{shown}:{port}{path}"


def exposure_warning(host: str) -> str | None:
    """What binding beyond loopback means, or None for loopback."""
    if is_loopback(host):
        return None
    return (
        f"binding to {host}: other machines can reach this server; /v1 needs the API key, "
        "but vLLM answers /invocations (a whole chat answer), /metrics, /tokenize and its other "
        "routes without one (README: Security)"
    )
