"""The deployment's API key: given with --api-key or generated, stored 0600, never printed."""

from __future__ import annotations

import secrets
from pathlib import Path

from sm120.core.bounded import is_regular_file
from sm120.core.errors import SM120Error
from sm120.engine.state import deployment_dir, write_private_atomically

KEY_FILE = "api_key"


def key_path(name: str) -> Path:
    return deployment_dir(name) / KEY_FILE


def ensure_api_key(name: str, given: str | None) -> Path:
    """Store the given key, or keep/generate one, and return where it lives. Every
    deployment gets a key: a blank one would leave the server open to anyone."""
    path = key_path(name)
    if given is not None:
        write_private_atomically(path, check_api_key(given))
    elif read_api_key(str(path)) is None:
        write_private_atomically(path, secrets.token_urlsafe(32))
    return path


def check_api_key(key: str) -> str:
    if not key or any(char.isspace() or not char.isprintable() for char in key):
        raise SM120Error(
            "--api-key must be printable text without spaces",
            "leave it out and a key is generated (stored 0600 beside the deployment)",
        )
    return key


# A key is a few dozen characters; a pointer to /dev/zero or a FIFO must not hold us.
MAX_KEY_BYTES = 4096


def read_api_key(path: str | None) -> str | None:
    """The key in the file a state file points at; None when there is no readable key there
    (a FIFO, a device or a huge file is no key file)."""
    if not path or not is_regular_file(Path(path)):
        return None
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_KEY_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_KEY_BYTES:
        return None
    return data.decode("utf-8", errors="replace").strip() or None
