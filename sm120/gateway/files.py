"""Where the gateway keeps what it needs between invocations: its API key, its locked pid
file, what it listens on, and its log. All of it sits under sm120's (private) state dir."""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sm120.core.bounded import is_regular_file
from sm120.core.paths import sm120_home
from sm120.core.pidlock import lock_holder
from sm120.engine.secrets import read_api_key
from sm120.engine.state import private_dir, write_private_atomically


@dataclass(frozen=True)
class GatewayFiles:
    root: Path

    @property
    def api_key(self) -> Path:
        return self.root / "api_key"

    @property
    def pid(self) -> Path:
        return self.root / "gateway.pid"

    @property
    def address(self) -> Path:
        return self.root / "gateway.json"

    @property
    def log(self) -> Path:
        return self.root / "gateway.log"

    @property
    def access_log(self) -> Path:
        """One line per request and per start, stop, swap or refusal (access_log.py)."""
        return self.root / "access.log"

    @property
    def usage_db(self) -> Path:
        """Who used what (sm120.gateway.usage); its -wal and -shm files sit beside it."""
        return self.root / "usage.db"

    @property
    def request_log(self) -> Path:
        """The opt-in log of each request's prompt structure (sm120.gateway.requestlog)."""
        return self.root / "requests" / "requests.jsonl"

    @property
    def aliases(self) -> Path:
        """Aliases read at every start when no --aliases names another file."""
        return self.root / "aliases.yaml"


def gateway_files(*, create: bool = True) -> GatewayFiles:
    """The gateway's files; `create=False` for commands that only read (status, stop), which
    must not make or chmod folders in a SM120_HOME that may be shared."""
    folder = sm120_home() / "gateway"
    return GatewayFiles(private_dir(folder) if create else folder)


@dataclass(frozen=True)
class GatewayAddress:
    """What a running gateway listens on, written by the gateway itself once it listens."""

    host: str
    port: int
    pid: int
    started_at: float
    max_awake: int
    # Alias name -> deployment, as the gateway was started with them.
    aliases: dict[str, str] = field(default_factory=dict)


def save_address(files: GatewayFiles, address: GatewayAddress) -> None:
    write_private_atomically(files.address, json.dumps(asdict(address)) + "\n")


def running_gateway(files: GatewayFiles) -> tuple[int, GatewayAddress | None] | None:
    """The pid of the gateway holding the lock and where it listens, or None when none runs.
    The lock, not the file, says whether one runs: the pid in a file may be anybody's now."""
    pid = lock_holder(files.pid)
    if pid is None:
        return None
    if not is_regular_file(files.address):
        return pid, None
    try:
        data = json.loads(files.address.read_text(encoding="utf-8"))
        address = GatewayAddress(**data)
    except (OSError, ValueError, TypeError, RecursionError):
        return pid, None
    return pid, address if address.pid == pid else None


GATEWAY_KEY_REMEDY = (
    "delete it; the next 'sm120 gateway start' writes a new key (point clients at it again: "
    "sm120 connect)"
)


def ensure_gateway_key(files: GatewayFiles) -> str:
    """The gateway's own key: generated on first start, kept 0600, never printed."""
    key = read_api_key(str(files.api_key), GATEWAY_KEY_REMEDY)
    if key is None:
        key = secrets.token_urlsafe(32)
        write_private_atomically(files.api_key, key)
    return key
