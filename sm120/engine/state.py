"""Where deployment state lives: one directory per deployment, one JSON file in it.

The state file is what lets a later `sm120` invocation find, watch and stop a deployment
that an earlier (long exited) invocation started. Logs live next to it and outlive it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error
from sm120.core.net import is_host
from sm120.core.paths import sm120_home
from sm120.core.pidlock import PidLock, lock_holder
from sm120.core.records import field_values

STATE_FILE = "state.json"
LOCK_FILE = "lock"
# Linux's PID_MAX_LIMIT: no process id is larger. 0 and 1 are the kernel's and init's.
PID_MAX = 4_194_304
# Seconds since 1970 up to the year 5138: beyond it a time is a typo, and too big to format.
LATEST_TIME = 1e11

# Names become directory names: keep them to one safe path component.
_VALID_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class StateError(SM120Error):
    """A deployment name or state file that cannot be used."""


def deployments_root() -> Path:
    return sm120_home() / "deployments"


def is_deployment_name(name: str) -> bool:
    return bool(_VALID_NAME.match(name))


def check_deployment_name(name: str) -> str:
    if not _VALID_NAME.match(name):
        raise StateError(
            f"invalid deployment name {name!r}",
            hint="use letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return name


def deployment_path(name: str) -> Path:
    """Where a deployment's files are, made and tightened by nobody: for commands that only
    read (status), in a SM120_HOME that may be shared. A folder that is a link out of the
    state tree is refused here as writes refuse it (private_dir): what it points at is not a
    deployment sm120 made, and reading its state would have `stop` signal what it names."""
    home = refuse_home_file()
    path = deployments_root() / check_deployment_name(name)
    for folder in (path.parent, path):
        _refuse_leaving_link(folder, home)
    return path


def deployment_dir(name: str) -> Path:
    path = deployments_root() / check_deployment_name(name)
    private_dir(path)
    return path


# A unix socket's path must fit sockaddr_un (108 bytes with its NUL, Linux).
SOCKET_PATH_MAX = 107
SOCKET_FOLDER = "engine-socket"
SOCKET_NAME = "api.sock"


def engine_socket_path(name: str, *, create: bool = True) -> Path:
    """Where a warded deployment's engine listens: a socket in a 0700 folder of its own, so
    that only this user (sm120) can connect. A state tree too deep for a socket's path gets
    the folder under /tmp/sm120-UID instead, named by a hash of the deployment's folder.
    `create=False` (a dry run) only says where, making nothing."""
    folder = (deployment_dir(name) if create else deployment_path(name)) / SOCKET_FOLDER
    if len(os.fsencode(folder / SOCKET_NAME)) > SOCKET_PATH_MAX:
        digest = hashlib.sha256(os.fsencode(deployment_path(name).resolve())).hexdigest()[:16]
        folder = _private_tmp(create) / digest
    if create:
        folder.mkdir(mode=0o700, exist_ok=True)
        _refuse_foreign(folder)
    return folder / SOCKET_NAME


def prepare_engine_socket(path: str) -> None:
    """Before an engine starts on `path`: its 0700 folder there (a stop removed it; a relaunch
    from a saved spec comes back to it) and no stale socket in it (the engine's bind would
    fail)."""
    socket = Path(path)
    socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _refuse_foreign(socket.parent)
    socket.unlink(missing_ok=True)


def remove_engine_socket(path: str) -> None:
    """The socket a stopped engine left behind, and its folder once empty (the next start
    makes both again)."""
    socket = Path(path)
    socket.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty, or already gone
        socket.parent.rmdir()


def _private_tmp(create: bool) -> Path:
    base = Path(tempfile.gettempdir()) / f"sm120-{os.getuid()}"
    if create:
        base.mkdir(mode=0o700, exist_ok=True)
        _refuse_foreign(base)
    return base


def _refuse_foreign(folder: Path) -> None:
    """A socket folder someone else made, or one others can enter, would let them at the
    engine: refused rather than used."""
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise StateError(
            f"{folder} is not a folder of this user's",
            hint=f"remove it (rm -r {folder}); sm120 makes its own socket folder there",
        )
    if info.st_mode & 0o077:
        folder.chmod(0o700)


def refuse_home_file() -> Path:
    """sm120's home, refused (core.paths.HomeError) when it is not a folder."""
    return sm120_home()


def private_dir(path: Path) -> Path:
    """Create path as 0700, and so each missing folder from sm120's home down to it: the
    state tree holds API keys, logs with prompts, and what `stop` acts on."""
    home = refuse_home_file()
    ours = [folder for folder in (*reversed(path.parents), path) if folder.is_relative_to(home)]
    if not ours:
        path.mkdir(parents=True, exist_ok=True)
        return path
    home.parent.mkdir(parents=True, exist_ok=True)
    for folder in ours:
        _refuse_leaving_link(folder, home)
        folder.mkdir(mode=0o700, exist_ok=True)
        # Trees made by older versions (0755) are tightened as they are used.
        if folder.stat().st_mode & 0o077:
            with contextlib.suppress(PermissionError):
                folder.chmod(0o700)
    return path


def _refuse_leaving_link(folder: Path, home: Path) -> None:
    """A folder of the state tree that is a link out of it would have sm120 chmod, write and
    delete files somewhere it never made; a link within the tree is only another name."""
    if folder == home or not folder.is_symlink():
        return
    target = folder.resolve()
    if not target.is_relative_to(home.resolve()):
        raise StateError(
            f"{folder} is a link to {target}, outside sm120's state folder {home}",
            hint=f"remove the link (rm {folder}); sm120 makes its own folders there",
        )


@dataclass
class DeploymentState:
    name: str
    recipe: str
    runtime: str
    supervisor_pid: int
    engine_pid: int | None
    host: str
    port: int
    plan_hash: str
    started_at: float
    log_path: str
    exit_file: str
    served_model_name: str
    model_dir: str | None
    api_key_file: str | None
    # Docker runtime: the engine's container (found again by its labels if this is lost).
    container_id: str | None = None
    # When the supervisor and the engine started (clock ticks since boot, /proc/PID/stat):
    # a pid alone may by now belong to another program. None in files of older versions.
    supervisor_start: int | None = None
    engine_start: int | None = None
    # Where the engine itself listens when sm120's ward holds the deployment's port (a unix
    # socket in a 0700 folder, sm120.engine.ward): only sm120 reaches the engine there. None:
    # the engine listens on host:port itself (an engine ref with no unix socket).
    engine_socket: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeploymentState:
        """Checked field by field: what `stop` signals comes from here. Raises ValueError
        naming the first bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"it holds {type(data).__name__}, not a JSON object")
        return cls(**field_values(cls, data, _checked))

    @classmethod
    def from_json(cls, text: str) -> DeploymentState:
        return cls.from_dict(json.loads(text))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pid(value: Any) -> bool:
    return _is_int(value) and 1 < value <= PID_MAX


def _text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


# What each field must hold, and how to say so. A missing rule is a bug: see from_dict.
_FIELD_RULES: dict[str, tuple[Any, str]] = {
    "name": (lambda v: isinstance(v, str) and bool(_VALID_NAME.match(v)), "a deployment name"),
    "recipe": (_text, "a recipe name"),
    "runtime": (_text, "a runtime name"),
    "supervisor_pid": (_pid, f"a process id from 2 to {PID_MAX}"),
    "engine_pid": (lambda v: v is None or _pid(v), f"null or a process id from 2 to {PID_MAX}"),
    "host": (lambda v: isinstance(v, str) and is_host(v), "a host name or address"),
    "port": (lambda v: _is_int(v) and 1 <= v <= 65535, "a port from 1 to 65535"),
    "plan_hash": (lambda v: isinstance(v, str), "a string"),
    "started_at": (
        # Compared as numbers, not converted: a 400-digit integer has no float.
        lambda v: (_is_int(v) or isinstance(v, float)) and 0 <= v < LATEST_TIME,
        "a time in seconds since 1970",
    ),
    "log_path": (_text, "a file path"),
    "exit_file": (_text, "a file path"),
    "served_model_name": (lambda v: isinstance(v, str), "a string"),
    "model_dir": (lambda v: v is None or isinstance(v, str), "null or a folder path"),
    "api_key_file": (lambda v: v is None or isinstance(v, str), "null or a file path"),
    "container_id": (lambda v: v is None or isinstance(v, str), "null or a container id"),
    "supervisor_start": (lambda v: v is None or (_is_int(v) and v >= 0), "null or clock ticks"),
    "engine_start": (lambda v: v is None or (_is_int(v) and v >= 0), "null or clock ticks"),
    "engine_socket": (lambda v: v is None or _text(v), "null or a socket path"),
}


def _checked(name: str, value: Any) -> Any:
    valid, expected = _FIELD_RULES[name]
    if not valid(value):
        shown = json.dumps(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise ValueError(f"'{name}' must be {expected}, not {shown}")
    return value


def state_file(name: str) -> Path:
    return deployment_dir(name) / STATE_FILE


def save_state(state: DeploymentState) -> Path:
    target = state_file(state.name)
    write_private_atomically(target, state.to_json())
    return target


def write_private_atomically(target: Path, text: str) -> None:
    """Readers never see a half-written file: write a sibling temp file, then rename. Only a
    regular file (or nothing) is replaced: renaming over /dev/full or a FIFO would swap a
    device for a file, and over a link would drop the link."""
    _refuse_non_regular(target)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp already creates 0600; chmod keeps that true whatever the umask did.
        Path(tmp_name).chmod(0o600)
        Path(tmp_name).replace(target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp_name).unlink()
        raise


def _refuse_non_regular(target: Path) -> None:
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateError(f"cannot write {target}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = (
            "a link"
            if stat.S_ISLNK(mode)
            else "a folder"
            if stat.S_ISDIR(mode)
            else ("a device, FIFO or socket")
        )
        raise StateError(
            f"{target} is {kind}, not a regular file: sm120 will not replace it",
            hint="name a new or regular file to write",
        )


def load_state(name: str) -> DeploymentState | None:
    path = deployment_path(name) / STATE_FILE
    if not path.is_file():
        return None
    return _read_state_file(path)


def _read_state_file(path: Path) -> DeploymentState:
    try:
        state = DeploymentState.from_json(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise _unusable(path, f"is not JSON ({exc.msg}, line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:
        raise _unusable(path, f"is unusable: {exc}") from None
    # A copied or edited file must not make one deployment's command act on another's.
    if state.name != path.parent.name:
        raise _unusable(path, f"is unusable: it names deployment '{state.name}'")
    return state


def _unusable(path: Path, what: str) -> StateError:
    return StateError(
        f"deployment state file {path} {what}",
        hint=f"delete {path} if that deployment is no longer running",
    )


def list_states(skipped: dict[str, str] | None = None) -> list[DeploymentState]:
    """Every deployment's state, by name. A folder linked out of the state tree is never
    read: with `skipped`, it is left out and named there with the reason (what `status`
    shows); without, it refuses the whole list, as a damaged state file does."""
    home = refuse_home_file()
    root = deployments_root()
    _refuse_leaving_link(root, home)
    if not root.is_dir():
        return []
    states = []
    for folder in sorted(root.iterdir()):
        if folder.name.startswith("."):
            continue
        try:
            _refuse_leaving_link(folder, home)
        except StateError as exc:
            if skipped is None:
                raise
            skipped[folder.name] = exc.one_line()
            continue
        path = folder / STATE_FILE
        if path.is_file():
            states.append(_read_state_file(path))
    return states


class DeploymentBusy(StateError):
    """Another sm120 is launching, stopping or restarting this deployment."""


@contextlib.contextmanager
def deployment_lock(name: str, doing: str) -> Iterator[None]:
    """Held over everything that starts, stops or replaces a deployment, so two of them
    never interleave; the second is refused before it writes anything."""
    path = deployment_dir(name) / LOCK_FILE
    lock = PidLock(path)
    if not lock.acquire():
        holder = lock_holder(path)
        who = f"another sm120 (pid {holder})" if holder else "another sm120"
        raise DeploymentBusy(
            f"cannot {doing} deployment '{name}': {who} is launching or stopping it right now",
            "wait for that to finish, then see 'sm120 status'",
        )
    try:
        yield
    finally:
        lock.release()


def clear_state(name: str) -> None:
    """Forget the deployment; its log files stay for post-mortems."""
    with contextlib.suppress(FileNotFoundError):
        (deployment_path(name) / STATE_FILE).unlink()
