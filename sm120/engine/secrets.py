"""The deployment's API key: given with --api-key or generated, stored 0600, never printed."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

from sm120.core.bounded import is_regular_file
from sm120.core.errors import SM120Error
from sm120.engine.state import deployment_dir, write_private_atomically

KEY_FILE = "api_key"
# What a key may hold: an HTTP header carries it.
_PRINTABLE_ASCII = re.compile(rb"[\x21-\x7e]+")


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
    # An HTTP header carries it: printable ASCII, as read_api_key takes it back.
    if not key or not _PRINTABLE_ASCII.fullmatch(key.encode("utf-8", errors="replace")):
        raise SM120Error(
            "--api-key must be printable ASCII text without spaces",
            "leave it out and a key is generated (stored 0600 beside the deployment)",
        )
    return key


# A key is a few dozen characters; a pointer to /dev/zero or a FIFO must not hold us.
MAX_KEY_BYTES = 4096


class KeyFileError(SM120Error):
    """A key file that holds something other than a key."""


DEPLOYMENT_KEY_REMEDY = "delete it; launch writes a new key (or write the key you use into it)"
MOUNTED_KEY_REMEDY = "write the key into it: one line of printable ASCII"


def read_api_key(path: str | None, remedy: str = DEPLOYMENT_KEY_REMEDY) -> str | None:
    """The key in the file a state file points at; None when there is no readable key there
    (a FIFO, a device or a huge file is no key file). A file of other bytes is refused
    (KeyFileError), its hint `remedy`: what writes that file again."""
    if not path or not is_regular_file(Path(path)):
        return None
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_KEY_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_KEY_BYTES:
        return None
    key = data.strip()
    if key and not _PRINTABLE_ASCII.fullmatch(key):
        # Decoded with replacement characters it would be a key nobody holds (and no HTTP
        # header can carry it): the file is damaged, so say which one.
        raise KeyFileError(
            f"key file {path} holds bytes that are not a key (printable ASCII)", remedy
        )
    return key.decode("ascii") or None
