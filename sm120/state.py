"""Where deployment state lives: one directory per deployment, one JSON file in it.

The state file is what lets a later `sm120` invocation find, watch and stop a deployment
that an earlier (long exited) invocation started. Logs live next to it and outlive it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.errors import SM120Error

STATE_FILE = "state.json"

# Names become directory names: keep them to one safe path component.
_VALID_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class StateError(SM120Error):
    """A deployment name or state file that cannot be used."""


def sm120_home() -> Path:
    explicit = os.environ.get("SM120_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg_state = os.environ.get("XDG_STATE_HOME")
    if xdg_state:
        return Path(xdg_state).expanduser() / "sm120"
    return Path.home() / ".local" / "state" / "sm120"


def deployments_root() -> Path:
    return sm120_home() / "deployments"


def check_deployment_name(name: str) -> str:
    if not _VALID_NAME.match(name):
        raise StateError(
            f"invalid deployment name {name!r}",
            hint="use letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return name


def deployment_dir(name: str) -> Path:
    path = deployments_root() / check_deployment_name(name)
    path.mkdir(parents=True, exist_ok=True)
    return path


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

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeploymentState:
        # Unknown keys come from newer versions of sm120: ignore them rather than refuse.
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    @classmethod
    def from_json(cls, text: str) -> DeploymentState:
        return cls.from_dict(json.loads(text))


def state_file(name: str) -> Path:
    return deployment_dir(name) / STATE_FILE


def save_state(state: DeploymentState) -> Path:
    target = state_file(state.name)
    write_private_atomically(target, state.to_json())
    return target


def write_private_atomically(target: Path, text: str) -> None:
    """Readers never see a half-written file: write a sibling temp file, then rename."""
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


def load_state(name: str) -> DeploymentState | None:
    path = deployments_root() / check_deployment_name(name) / STATE_FILE
    if not path.is_file():
        return None
    return _read_state_file(path)


def _read_state_file(path: Path) -> DeploymentState:
    try:
        return DeploymentState.from_json(path.read_text(encoding="utf-8"))
    except (ValueError, TypeError) as exc:
        raise StateError(
            f"deployment state file {path} is unreadable ({exc})",
            hint=f"delete {path} if that deployment is no longer running",
        ) from exc


def list_states() -> list[DeploymentState]:
    root = deployments_root()
    if not root.is_dir():
        return []
    paths = sorted(root.glob(f"*/{STATE_FILE}"))
    return [_read_state_file(path) for path in paths]


def clear_state(name: str) -> None:
    """Forget the deployment; its log files stay for post-mortems."""
    with contextlib.suppress(FileNotFoundError):
        (deployments_root() / check_deployment_name(name) / STATE_FILE).unlink()
