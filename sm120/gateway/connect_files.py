"""The client files `sm120 connect --write` changes, the copy it keeps of each one first, and
`sm120 connect CLIENT --undo` putting them back.

A file is backed up the first time sm120 writes it: later writes keep that first copy, so an
undo always returns to what the user had before sm120 touched it (or removes a file sm120
created). The record (`$SM120_HOME/connect/record.json`) also keeps what each write was for,
the deployment and its context window, so `sm120 connect` and `sm120 gateway status` can say
when a relaunch with another context made the client's settings stale.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from sm120.core.bounded import read_capped
from sm120.core.errors import SM120Error
from sm120.core.paths import sm120_home
from sm120.engine.state import private_dir, write_private_atomically

# A client's config file is small; anything bigger is not the file we think it is.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MOVE_ASIDE = "move it aside and retry"


class ConnectError(SM120Error):
    """No endpoint to connect to, or a client config that cannot be written."""


@dataclass(frozen=True)
class Written:
    """One file sm120 wrote for a client, and what it was written for."""

    client: str
    path: str
    # Where the user's own file was copied first; None: there was none (sm120 created it).
    backup: str | None
    sha256: str
    deployment: str | None
    model: str
    max_model_len: int | None
    written_at: float


@contextlib.contextmanager
def os_errors(what: str, path: Path) -> Iterator[None]:
    """A permission, a full disk or a name too long is one line naming the file, not a
    traceback."""
    try:
        yield
    except SM120Error:
        raise
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConnectError(f"cannot {what} {path}: {reason}", MOVE_ASIDE) from None


def connect_dir() -> Path:
    with os_errors("create", sm120_home() / "connect"):
        return private_dir(sm120_home() / "connect")


def _record_path() -> Path:
    return connect_dir() / "record.json"


def load_record() -> dict[str, Written]:
    """Path -> what sm120 wrote there. A record that cannot be read is said so, not guessed."""
    path = sm120_home() / "connect" / "record.json"
    if not path.is_file():
        return {}
    with os_errors("read", path):
        data = read_capped(path, MAX_CONFIG_BYTES, "connect record", MOVE_ASIDE)
    try:
        entries = json.loads(data)
        return {entry["path"]: Written(**entry) for entry in entries}
    except (ValueError, TypeError, KeyError, RecursionError):
        raise ConnectError(
            f"sm120's record of written client files {path} is unreadable", MOVE_ASIDE
        ) from None


def _save_record(record: dict[str, Written]) -> None:
    text = json.dumps([asdict(entry) for entry in record.values()], indent=1) + "\n"
    target = _record_path()
    with os_errors("write", target):
        write_private_atomically(target, text)


def existing_text(path: Path, what: str) -> str | None:
    """The file's text, None when there is none; a link, a folder or a device is refused:
    sm120 writes only regular files, and never through a link."""
    with os_errors("read", path):
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(mode):
            raise ConnectError(f"{what} {path} is not a regular file", MOVE_ASIDE)
        raw = read_capped(path, MAX_CONFIG_BYTES, what, MOVE_ASIDE)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConnectError(
            f"{what} {path} is not UTF-8 text; nothing was written", MOVE_ASIDE
        ) from None


def client_folder(path: Path) -> Path:
    """The client's own folder (~/.claude, ~/.codex): made 0700 when missing, tightened to
    0700 when others can read it, and refused when it is a link (no writes through one)."""
    with os_errors("create", path):
        if path.is_symlink():
            raise ConnectError(
                f"{path} is a link; sm120 writes no client files through links",
                "replace the link with the folder it points to, then retry",
            )
        if path.exists() and not path.is_dir():
            raise ConnectError(f"{path} is not a folder", MOVE_ASIDE)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.stat().st_mode & 0o077:
            with contextlib.suppress(PermissionError):
                path.chmod(0o700)
    return path


def write_client_file(path: Path, text: str, previous: str | None, stamp: Written) -> Written:
    """Back up `previous` (the user's file) unless an earlier write already did, write `text`
    0600 and atomically, and record it."""
    record = load_record()
    earlier = record.get(str(path))
    backup = earlier.backup if earlier is not None else None
    if earlier is None and previous is not None:
        backup_path = connect_dir() / f"{stamp.client}-{path.name}.{int(time.time())}.backup"
        with os_errors("back up", path):
            write_private_atomically(backup_path, previous)
        backup = str(backup_path)
    with os_errors("write", path):
        write_private_atomically(path, text)
    entry = Written(
        stamp.client, str(path), backup, _sha256(text), stamp.deployment, stamp.model,
        stamp.max_model_len, time.time(),
    )  # fmt: skip
    record[str(path)] = entry
    _save_record(record)
    return entry


def undo(client: str) -> list[str]:
    """Put back every file sm120 wrote for `client`; what was done, one line each. A file the
    user changed since is left alone, and said so: their edit is not sm120's to drop."""
    record = load_record()
    mine = [entry for entry in record.values() if entry.client == client]
    if not mine:
        raise ConnectError(
            f"sm120 has written no {client} files (or they were restored already)",
            f"sm120 connect {client} --write writes them",
        )
    done: list[str] = []
    for entry in mine:
        path = Path(entry.path)
        current = existing_text(path, f"{client} file")
        if current is not None and _sha256(current) != entry.sha256:
            where = f"; your original is in {entry.backup}" if entry.backup else ""
            raise ConnectError(
                f"{path} changed since sm120 wrote it; nothing was restored{where}",
                "merge by hand, or delete the file and rerun --undo",
            )
        if entry.backup is not None:
            original = existing_text(Path(entry.backup), "backup")
            if original is None:
                raise ConnectError(f"the backup {entry.backup} of {path} is gone", MOVE_ASIDE)
            with os_errors("restore", path):
                write_private_atomically(path, original)
                Path(entry.backup).unlink()
            done.append(f"restored {path} as it was before sm120 wrote it")
        else:
            with os_errors("remove", path):
                path.unlink(missing_ok=True)
            done.append(f"removed {path} (sm120 had created it)")
        del record[entry.path]
    _save_record(record)
    return done


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def home_of_user() -> Path:
    """The user's home as the clients resolve it ($HOME first)."""
    return Path(os.environ.get("HOME") or Path.home())
