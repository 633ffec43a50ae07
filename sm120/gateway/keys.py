"""Keys per person: who a request is from, which models it may use and its limits.

A key is stored only as HMAC-SHA256(secret, key): the secret sits beside the store in the
gateway's folder (0600), so a copy of the store alone opens nothing and cannot be
brute-forced offline without the secret. HMAC is fast (about a microsecond), which is what
lets the fast path look a key up per request in a dict of digests instead of checking a slow
password hash against every key. The gateway's own key (`api_key`, or a compose secret) is the
admin key: no limits, every model, the dashboard.

The store is re-read when its file changes (its stat is looked at, at most every
RELOAD_CHECK_S): `keys revoke` and `keys rotate` act on a running gateway without a restart.

One credential per request: a client says who it is once, in `Authorization: Bearer KEY` or
`x-api-key: KEY`. Two different credentials (two Authorization headers, a Bearer beside an
x-api-key that differs) are refused, never resolved by taking one of them.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sm120.core.bounded import is_regular_file, read_json_capped
from sm120.core.errors import SM120Error
from sm120.engine.state import write_private_atomically

ADMIN = "admin"
# Key names are shown in tables, the dashboard and Prometheus labels: a plain word.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
KEY_PREFIX = "sm120-"
# A store of thousands of keys is a few hundred KiB; more is not a key store.
MAX_STORE_BYTES = 8 << 20
RELOAD_CHECK_S = 0.5
# The store's HMAC secret: 64 hex digits as written; any printable ASCII of a usable length
# is taken (a secret restored by hand), anything else is a damaged file.
MIN_SECRET_CHARS = 32
MAX_SECRET_BYTES = 4096
_SECRET = re.compile(rb"[\x21-\x7e]{32,4096}")
STORE_VERSION = 1

AMBIGUOUS = object()  # two different credentials in one request


class KeyError_(SM120Error):
    """A `keys` command that cannot do what it was asked."""


@dataclass(frozen=True)
class KeyEntry:
    """One person's key, as the store holds it (the digest, never the key)."""

    name: str
    digest: str  # hex HMAC-SHA256 of the key under the store's secret
    models: str | None = None  # comma-separated fnmatch patterns; None: every model
    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    expires: str | None = None  # YYYY-MM-DD: valid through that day (UTC)
    created: float = 0.0
    admin: bool = field(default=False, compare=False)

    def allows(self, model: str) -> bool:
        if self.models is None:
            return True
        return any(fnmatch.fnmatchcase(model, p.strip()) for p in self.models.split(","))

    def expired(self, now: float) -> bool:
        if self.expires is None:
            return False
        day = dt.datetime.fromtimestamp(now, dt.timezone.utc).date().isoformat()
        return day > self.expires

    def limits(self) -> str:
        parts = [
            f"{label} {value}"
            for label, value in (
                ("rpm", self.rpm), ("tpm", self.tpm), ("concurrency", self.concurrency)
            )
            if value is not None
        ]  # fmt: skip
        return ", ".join(parts) or "none"


def key_digest(secret: bytes, key: bytes) -> str:
    return hmac.new(secret, key, hashlib.sha256).hexdigest()


# --- one credential per request ---------------------------------------------------------------
def presented_credential(headers: Iterable[tuple[str, str]]) -> bytes | object:
    """The key a request carries (b"" when none), or AMBIGUOUS when it carries two that
    differ. `headers` are (name, value) pairs as sent, every repeat included: a client that
    sends the same key in both headers said one thing; one that sends two keys did not."""
    found: set[str] = set()
    for name, value in headers:
        lowered = name.lower()
        value = value.strip()
        if lowered == "authorization" and value:
            # Another scheme than Bearer is a credential too, and not one the gateway takes.
            bearer = value[:7].lower() == "bearer "
            found.add(value[7:].strip() if bearer else "\0" + value)
        elif lowered == "x-api-key" and value:
            found.add(value)
    found.discard("")  # an empty header says nothing
    if len(found) > 1:
        return AMBIGUOUS
    if not found:
        return b""
    only = next(iter(found))
    return b"" if only.startswith("\0") else only.encode("utf-8", "surrogateescape")


# --- the store on disk ------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyStore:
    """The files: `keys.json` (entries) and `keys.secret` (the HMAC secret), both 0600."""

    folder: Path

    @property
    def path(self) -> Path:
        return self.folder / "keys.json"

    @property
    def secret_path(self) -> Path:
        return self.folder / "keys.secret"

    def secret(self, create: bool = False) -> bytes | None:
        """The HMAC secret; None when there is none yet (and not `create`). A secret file
        that holds something else is refused, never read with replacement characters nor
        written over: every stored digest was made with it."""
        path = self.secret_path
        if path.exists() or path.is_symlink():
            return self._stored_secret()
        if not create:
            return None
        write_private_atomically(path, secrets.token_hex(32))
        return self._stored_secret()

    def _stored_secret(self) -> bytes:
        path = self.secret_path
        data = b""
        if is_regular_file(path):
            with path.open("rb") as handle:
                data = handle.read(MAX_SECRET_BYTES + 1).strip()
        if len(data) < MIN_SECRET_CHARS or not _SECRET.fullmatch(data):
            raise KeyError_(
                f"the key store's secret {path} is damaged (it must hold {MIN_SECRET_CHARS} "
                "to 4,096 characters of printable ASCII)",
                f"restore it from a backup, or remove it and {self.path} and add the keys "
                "again (sm120 gateway keys add)",
            )
        return data

    def entries(self) -> list[KeyEntry]:
        if not self.path.exists():
            return []
        data = read_json_capped(
            self.path, MAX_STORE_BYTES, "the key store", f"remove {self.path} to start over"
        )
        entries = parse_entries(data, self.path)
        # Keys without the secret their digests were made with open nothing: say so.
        if entries and self.secret() is None:
            raise KeyError_(
                f"the key store {self.path} holds keys but their secret {self.secret_path} "
                "is missing",
                f"restore it from a backup, or remove {self.path} and add the keys again",
            )
        return entries

    def save(self, entries: list[KeyEntry]) -> None:
        rows = [{k: v for k, v in asdict(e).items() if k != "admin"} for e in entries]
        text = json.dumps({"version": STORE_VERSION, "keys": rows}, indent=1) + "\n"
        write_private_atomically(self.path, text)


def parse_entries(data: object, path: Path) -> list[KeyEntry]:
    rows = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise KeyError_(f"{path} is not a key store", f"remove {path} to start over")
    entries = []
    for row in rows:
        try:
            entry = KeyEntry(**row)
        except TypeError:
            raise KeyError_(
                f"{path} holds an unreadable entry", "see 'sm120 gateway keys list'"
            ) from None
        if not isinstance(entry.name, str) or not isinstance(entry.digest, str):
            raise KeyError_(f"{path} holds an unreadable entry", "see 'sm120 gateway keys list'")
        entries.append(entry)
    return entries


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name) or name == ADMIN:
        raise KeyError_(
            f"'{name.encode('unicode_escape').decode()[:80]}' is not a key name",
            "use letters, digits and . _ @ - (up to 64, starting with a letter or digit; "
            "'admin' is the gateway's own key)",
        )
    return name


def check_expires(text: str | None, today: dt.date | None = None) -> str | None:
    if text is None:
        return None
    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise KeyError_(
            f"--expires '{text[:40]}' is not a date", "write it as YYYY-MM-DD"
        ) from None
    if day < (today or dt.datetime.now(dt.timezone.utc).date()):
        raise KeyError_(f"--expires {text} is in the past", "give a day from today on")
    return day.isoformat()


def check_limit(label: str, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise KeyError_(f"{label} must be at least 1 (got {value})", f"leave {label} out for none")
    return value


def add_key(store: KeyStore, entry: KeyEntry) -> str:
    """Store `entry` (its digest filled in) and return the new key, to be shown once."""
    entries = store.entries()
    if any(e.name == entry.name for e in entries):
        raise KeyError_(
            f"a key named '{entry.name}' exists", f"'sm120 gateway keys rotate {entry.name}'"
        )
    secret = store.secret(create=True)
    assert secret is not None
    key = new_key()
    entries.append(replace(entry, digest=key_digest(secret, key.encode()), created=time.time()))
    store.save(entries)
    return key


def add_keys(store: KeyStore, entries: list[KeyEntry]) -> list[str]:
    """Many keys in one write (a benchmark's thousand teammates); the keys, in order."""
    secret = store.secret(create=True)
    assert secret is not None
    keys = [new_key() for _ in entries]
    now = time.time()
    added = [
        replace(e, digest=key_digest(secret, k.encode()), created=now)
        for e, k in zip(entries, keys, strict=True)
    ]
    store.save(store.entries() + added)
    return keys


def revoke_key(store: KeyStore, name: str) -> None:
    entries = store.entries()
    kept = [e for e in entries if e.name != name]
    if len(kept) == len(entries):
        raise _unknown(name)
    store.save(kept)


def rotate_key(store: KeyStore, name: str) -> str:
    """A new key for `name`, same limits; the old one stops working at once."""
    entries = store.entries()
    secret = store.secret(create=True)
    assert secret is not None
    key = new_key()
    digest = key_digest(secret, key.encode())
    changed = [replace(e, digest=digest) if e.name == name else e for e in entries]
    if changed == entries:
        raise _unknown(name)
    store.save(changed)
    return key


def _unknown(name: str) -> KeyError_:
    return KeyError_(f"no key named '{name[:80]}'", "see 'sm120 gateway keys list'")


# --- the gateway's view: a dict of digests, kept fresh ---------------------------------------
class KeyRing:
    """Who a presented key belongs to: one HMAC and one dict lookup per request. (A dict
    lookup of an HMAC digest leaks nothing useful in its timing: without the secret, nobody
    can aim a guess at a digest.)"""

    def __init__(self, admin_key: str, store: KeyStore | None) -> None:
        self.store = store
        self._admin_key = admin_key.encode()
        self._secret = secrets.token_bytes(32)  # until the store has one
        self._by_digest: dict[bytes, KeyEntry] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._checked_at = float("-inf")
        self.names: tuple[str, ...] = (ADMIN,)
        self.reload_errors = 0
        self._load()

    def lookup(self, presented: bytes) -> KeyEntry | None:
        now = time.monotonic()
        if now - self._checked_at > RELOAD_CHECK_S:
            self._checked_at = now
            if self._file_stamp() != self._stamp:
                self._load()
        if not presented:
            return None
        return self._by_digest.get(hmac.digest(self._secret, presented, "sha256"))

    def entries(self) -> list[KeyEntry]:
        return list(self._by_digest.values())

    def _file_stamp(self) -> tuple[int, int, int] | None:
        if self.store is None:
            return None
        try:
            info = self.store.path.stat()
        except OSError:
            return None
        return (info.st_ino, info.st_mtime_ns, info.st_size)

    def _load(self) -> None:
        stamp = self._file_stamp()
        entries: list[KeyEntry] = []
        secret = None
        if self.store is not None:
            try:
                secret = self.store.secret()
                entries = self.store.entries() if secret is not None else []
            except (SM120Error, OSError, ValueError):
                # A store broken while the gateway runs keeps the keys it had: the admin key
                # and the last good read. `keys list` names the defect.
                self.reload_errors += 1
                self._stamp = stamp
                return
        if secret is not None:
            self._secret = secret
        table: dict[bytes, KeyEntry] = {}
        for entry in entries:
            try:
                table[bytes.fromhex(entry.digest)] = entry
            except ValueError:
                continue
        admin = KeyEntry(ADMIN, "", admin=True)
        table[hmac.digest(self._secret, self._admin_key, "sha256")] = admin
        self._by_digest = table
        self._stamp = stamp
        self.names = (ADMIN, *sorted(e.name for e in entries))


def describe(entry: KeyEntry) -> dict[str, Any]:
    """What `keys list` shows of an entry: everything but the digest."""
    row = asdict(entry)
    row.pop("digest")
    row.pop("admin")
    return row
