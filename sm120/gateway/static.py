"""Backends given in a file instead of found in sm120's state: what the gateway reads inside a
compose project (`sm120 compose A B`), where no state files exist.

The file is JSON, and holds no secret, only where each key lives:

    {"backends": [{"model": "tiny", "service": "tiny", "url": "http://tiny:8000",
                   "key_file": "/run/secrets/tiny_key"}]}

Each backend is taken as running and is never started, stopped or put to sleep: compose
owns those containers. A backend may add `"socket": "/path/api.sock"`, a unix socket the
gateway reaches it on (its url then gives only the Host header), as a warded deployment's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error
from sm120.engine.secrets import MOUNTED_KEY_REMEDY, read_api_key
from sm120.gateway.backends import Backend

BACKENDS_HINT = 'write {"backends": [{"model", "service", "url", "key_file"}, ...]}'


class StaticBackendsError(SM120Error):
    """A backends file that cannot be used."""


@dataclass(frozen=True)
class StaticBackend:
    model: str
    service: str
    url: str
    key_file: str


def backends_document(backends: list[StaticBackend]) -> str:
    """The file `load_static_backends` reads (the compose writer calls this)."""
    rows = [
        {"model": b.model, "service": b.service, "url": b.url, "key_file": b.key_file}
        for b in backends
    ]
    return json.dumps({"backends": rows}, indent=2) + "\n"


def load_static_backends(path: Path) -> dict[str, Backend]:
    """Every backend in the file, with its key read now: a missing key file is an error at
    start rather than a 401 on the first request."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise StaticBackendsError(
            f"cannot read backends file {path}: {exc.strerror or exc}", BACKENDS_HINT
        ) from None
    except ValueError as exc:
        raise StaticBackendsError(
            f"backends file {path} is not JSON: {exc}", BACKENDS_HINT
        ) from None
    found: dict[str, Backend] = {}
    for row in _rows(document, path):
        backend = _backend(row, path)
        if backend.model in found:
            raise StaticBackendsError(
                f"backends file {path} lists model '{backend.model}' twice", BACKENDS_HINT
            )
        found[backend.model] = backend
    return found


def _rows(document: Any, path: Path) -> list[Any]:
    rows = document.get("backends") if isinstance(document, dict) else None
    if not isinstance(rows, list) or not rows:
        raise StaticBackendsError(f"backends file {path} lists no backends", BACKENDS_HINT)
    return rows


def _backend(row: Any, path: Path) -> Backend:
    fields = ("model", "service", "url", "key_file")
    if not isinstance(row, dict) or not all(isinstance(row.get(f), str) for f in fields):
        raise StaticBackendsError(
            f"backends file {path}: each backend needs {', '.join(fields)} as text", BACKENDS_HINT
        )
    socket = row.get("socket")
    if socket is not None and not (isinstance(socket, str) and socket):
        raise StaticBackendsError(
            f"backends file {path}: backend '{row['model']}' has a socket that is not a path",
            BACKENDS_HINT,
        )
    key = read_api_key(row["key_file"], MOUNTED_KEY_REMEDY)
    if key is None:
        raise StaticBackendsError(
            f"backend '{row['model']}': its key file {row['key_file']} is missing or empty",
            "mount the key file the backend serves with (sm120 compose writes secrets/)",
        )
    return Backend(
        model=row["model"],
        deployment=row["service"],
        base_url=row["url"].rstrip("/"),
        api_key=key,
        running=True,
        startable=False,
        sleep_mode=False,
        socket=socket,
    )


def static_discover(backends: dict[str, Backend]) -> Callable[[], dict[str, Backend]]:
    def discover() -> dict[str, Backend]:
        return dict(backends)

    return discover
