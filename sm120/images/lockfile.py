"""Reading lock files (pip-compile / `uv pip compile` requirement lists): no I/O here."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
# Run with an engine's interpreter: its installed distributions as JSON (no pip needed).
INVENTORY_SCRIPT = (
    "import importlib.metadata as m, json\n"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)
# pip freeze leaves these out unless --all; a lock does too (uv's default).
INSTALLER_PACKAGES = frozenset({"pip", "setuptools", "wheel", "distribute"})


def canonical(name: str) -> str:
    """PEP 503 normalised name: Foo_Bar.baz -> foo-bar-baz."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Lock:
    pins: dict[str, str]
    unhashed: tuple[str, ...]
    unpinned: tuple[str, ...]


def parse_lock(text: str) -> Lock:
    """Pins (canonical name -> version), entries without a hash, lines that pin nothing."""
    pins: dict[str, str] = {}
    unhashed: list[str] = []
    unpinned: list[str] = []
    current: str | None = None
    hashed = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("--hash="):
            hashed = True
            continue
        if line.startswith("-"):  # an option line (--index-url, -e ...)
            continue
        if current is not None and not hashed:
            unhashed.append(current)
        match = _PIN.match(line)
        if match is None:
            unpinned.append(line.rstrip(" \\"))
            current, hashed = None, True
            continue
        current, hashed = canonical(match.group(1)), False
        pins[current] = match.group(2)
    if current is not None and not hashed:
        unhashed.append(current)
    return Lock(pins, tuple(unhashed), tuple(unpinned))


def inventory_differences(locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    """How an installed environment differs from its lock, one line per package."""
    installed = {k: v for k, v in installed.items() if k not in INSTALLER_PACKAGES}
    locked = {k: v for k, v in locked.items() if k not in INSTALLER_PACKAGES}
    lines = []
    for name in sorted(set(locked) | set(installed)):
        want, have = locked.get(name), installed.get(name)
        if want == have:
            continue
        if have is None:
            lines.append(f"{name}=={want} is locked but not installed")
        elif want is None:
            lines.append(f"{name}=={have} is installed but not locked")
        else:
            lines.append(f"{name} is {have}, the lock says {want}")
    return lines
