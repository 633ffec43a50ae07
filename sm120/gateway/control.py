"""`sm120 gateway start|stop|status` as library calls: start it detached (a process of its
own session that outlives the CLI) and find it again through its locked pid file.

Only the process holding the gateway's lock is ever signalled: that lock is taken by
nothing but a gateway, and the kernel lets go of it when that process ends, so a pid left
behind in a file never gets a signal meant for a gateway long gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from sm120.core.errors import SM120Error
from sm120.core.net import check_host, client_url, exposure_warning
from sm120.core.pidlock import end_holder, lock_is_held
from sm120.core.ports import ensure_port_free
from sm120.engine.background import start_detached
from sm120.gateway.aliases import as_table
from sm120.gateway.config import GatewayConfig, TurnPolicy
from sm120.gateway.files import GatewayAddress, GatewayFiles, ensure_gateway_key, running_gateway

GATEWAY_MODULE = "sm120.gateway"
START_WAIT_S = 20.0
STOP_WAIT_S = 10.0
# A hold longer than this would be a pause, not a head start.
MAX_FIRST_TOKEN_HOLD_S = 30.0


class GatewayError(SM120Error):
    """The gateway could not be started or stopped."""


@dataclass(frozen=True)
class GatewayStatus:
    running: bool
    pid: int | None
    address: GatewayAddress | None
    key_file: Path

    @property
    def url(self) -> str | None:
        if self.address is None:
            return None
        return client_url(self.address.host, self.address.port, "/v1")

    def as_dict(self) -> dict[str, object]:
        return {
            "name": "gateway",
            "kind": "gateway",
            "running": self.running,
            "pid": self.pid,
            "endpoint": self.url,
            "max_awake": self.address.max_awake if self.address else None,
            "aliases": self.address.aliases if self.address else {},
            "api_key_file": str(self.key_file),
        }

    def describe(self) -> str:
        if not self.running:
            return "gateway   not running (start it: sm120 gateway start)"
        where = self.url or "(address not written yet)"
        return f"gateway   {where}  pid {self.pid}  key in {self.key_file}"


def gateway_status(files: GatewayFiles) -> GatewayStatus:
    held = running_gateway(files)
    if held is None:
        return GatewayStatus(False, None, None, files.api_key)
    return GatewayStatus(True, held[0], held[1], files.api_key)


@dataclass(frozen=True)
class Started:
    status: GatewayStatus
    already: bool
    warning: str | None

    def describe(self) -> str:
        verb = "already running" if self.already else "started"
        return (
            f"gateway {verb} on {self.status.url} (pid {self.status.pid}); clients send the "
            f"key in {self.status.key_file} as 'Authorization: Bearer KEY' or 'x-api-key: KEY' "
            "(sm120 connect CLIENT prints a client's settings)"
        )


def check_config(config: GatewayConfig) -> GatewayConfig:
    host = check_host(config.host)
    if config.max_awake < 0:
        raise GatewayError("--max-awake must be 0 or more", "0 lets the gateway start nothing")
    if not 0 < config.turns.busy_share <= 1:
        raise GatewayError(
            f"--busy-share must be above 0 and at most 1, not {config.turns.busy_share:g}",
            "0.5 lets a key hold half an engine's slots while another key is busy on it",
        )
    if not 0 <= config.turns.first_token_hold_s <= MAX_FIRST_TOKEN_HOLD_S:
        raise GatewayError(
            f"--first-token-hold must be 0 to {MAX_FIRST_TOKEN_HOLD_S:g} seconds, not "
            f"{config.turns.first_token_hold_s:g}",
            "0 turns first token first off; 1 holds a flood back at most a second",
        )
    return dataclasses.replace(config, host=host)


def start_gateway(config: GatewayConfig, files: GatewayFiles) -> Started:
    """Start it detached, or say where the running one is (the same address only)."""
    config = check_config(config)
    current = gateway_status(files)
    if current.running:
        _same_address(current, config)
        return Started(current, True, None)
    if lock_is_held(files.pid):
        raise GatewayError(
            f"another program holds the gateway's lock {files.pid}, and it is no gateway",
            f"find it with 'fuser -v {files.pid}', end it, then start the gateway again",
        )
    ensure_port_free(config.host, config.port)
    ensure_gateway_key(files)
    process = _spawn(config, files)
    status = _wait_listening(process, files)
    return Started(status, False, exposure_warning(config.host))


def _same_address(current: GatewayStatus, config: GatewayConfig) -> None:
    address = current.address
    if address is None:
        return
    if (address.host, address.port) != (config.host, config.port):
        raise GatewayError(
            f"a gateway already runs on {address.host}:{address.port} (pid {current.pid})",
            "stop it first: sm120 gateway stop",
        )
    wanted = as_table(config.aliases)
    if config.aliases and address.aliases != wanted:
        raise GatewayError(
            f"a gateway already runs (pid {current.pid}) with other aliases: "
            f"{_aliases_words(address.aliases)}",
            "stop it first (sm120 gateway stop), then start it with the aliases you want",
        )


def _aliases_words(table: dict[str, str]) -> str:
    return ", ".join(f"{name}={target}" for name, target in table.items()) or "none"


def gateway_argv(config: GatewayConfig) -> list[str]:
    argv = [
        sys.executable, "-m", GATEWAY_MODULE,
        "--host", config.host, "--port", str(config.port),
        "--max-awake", str(config.max_awake), "--swap-wait", str(config.swap_wait_s),
    ]  # fmt: skip
    for alias in config.aliases:
        argv += ["--alias", f"{alias.name}={alias.target}"]
    if config.normalize_prompts:
        argv.append("--normalize-prompts")
    if not config.record_usage:
        argv.append("--no-usage")
    if config.request_log:
        argv.append("--request-log")
    if config.turns != TurnPolicy():
        argv += ["--busy-share", repr(config.turns.busy_share)]
        argv += ["--first-token-hold", repr(config.turns.first_token_hold_s)]
    return argv


def _spawn(config: GatewayConfig, files: GatewayFiles) -> subprocess.Popen[bytes]:
    return start_detached(gateway_argv(config), files.log)


def _wait_listening(process: subprocess.Popen[bytes], files: GatewayFiles) -> GatewayStatus:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        status = gateway_status(files)
        if status.pid == process.pid and status.url and _answers(status.url):
            return status
        if process.poll() is not None:
            raise GatewayError(
                f"the gateway exited at start: {_last_line(files.log)}",
                f"see {files.log}",
            )
        time.sleep(0.1)
    process.terminate()
    raise GatewayError(
        f"the gateway did not listen within {START_WAIT_S:.0f} s", f"see {files.log}"
    )


def _answers(url: str) -> bool:
    try:
        return httpx.get(url.removesuffix("/v1") + "/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _last_line(log: Path) -> str:
    with contextlib.suppress(OSError):
        lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        if lines:
            return lines[-1].removeprefix("Error: ")
    return "no output"


def stop_gateway(files: GatewayFiles, timeout_s: float = STOP_WAIT_S) -> int | None:
    """SIGTERM the gateway holding the lock (SIGKILL after timeout_s); its pid, or None when
    none ran."""
    held = running_gateway(files)
    if held is None:
        return None
    pid = held[0]
    end_holder(pid, lambda: _holds(files, pid), timeout_s)
    return pid


def _holds(files: GatewayFiles, pid: int) -> bool:
    held = running_gateway(files)
    return held is not None and held[0] == pid
