"""Where the monitor keeps things, and the settings `launch` hands it.

Under the deployment's state dir:
    logs/serve.log (+ .1 .2 .3)   the engine's output, rotated at 100 MB
    logs/peak.json                peak prefill/decode tok/s and running requests
    logs/history.jsonl (+ .1)     one sample per poll, bounded
    logs/events.jsonl (+ .1)      alerts and watchdog actions, bounded
    logs/monitor.log              the monitor's own stderr
    monitor/settings.json         what launch asked for (poll, wedge timeout, restart policy)
    monitor/launch_spec.json      how to start the engine again (no secrets), 0600
    monitor/live.json             the latest view, for `sm120 monitor` and `sm120 status`
    monitor/watchdog.json         the restart breaker: recent restarts (why, last log lines),
                                  the gave-up marker
    monitor/monitor.pid           the running monitor (locked while it runs)
    diagnostics/wedge-*/          what was captured at each wedge
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.defaults import STOP_TIMEOUT_S
from sm120.engine.runtime.base import LaunchSpec
from sm120.engine.state import private_dir
from sm120.monitor.gpu_activity import DEFAULT_LIVELOCK_S
from sm120.monitor.lock import monitor_pid_path
from sm120.monitor.peaks import read_json, write_json_atomically
from sm120.monitor.watchdog import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_RESTART_WINDOW_S,
    DEFAULT_WEDGE_TIMEOUT_S,
)
from sm120.recipe.restart_policy import DEFAULT_RESTART, DEFAULT_RESTART_BACKOFF_S


@dataclass(frozen=True)
class MonitorFiles:
    root: Path

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def serve_log(self) -> Path:
        return self.logs / "serve.log"

    @property
    def peak(self) -> Path:
        return self.logs / "peak.json"

    @property
    def history(self) -> Path:
        return self.logs / "history.jsonl"

    @property
    def events(self) -> Path:
        return self.logs / "events.jsonl"

    @property
    def monitor_log(self) -> Path:
        return self.logs / "monitor.log"

    @property
    def own(self) -> Path:
        return self.root / "monitor"

    @property
    def settings(self) -> Path:
        return self.own / "settings.json"

    @property
    def launch_spec(self) -> Path:
        return self.own / "launch_spec.json"

    @property
    def live(self) -> Path:
        return self.own / "live.json"

    @property
    def watchdog(self) -> Path:
        return self.own / "watchdog.json"

    @property
    def pid(self) -> Path:
        return monitor_pid_path(self.root)

    @property
    def diagnostics(self) -> Path:
        return self.root / "diagnostics"

    def make_dirs(self) -> None:
        for directory in (self.logs, self.own, self.diagnostics):
            private_dir(directory)


@dataclass(frozen=True)
class MonitorSettings:
    poll_s: float = 5.0
    wedge_timeout_s: float = DEFAULT_WEDGE_TIMEOUT_S
    # Frozen counters while the GPUs stay busy this long are a livelock (restarted like a
    # wedge, under the same restart_on_wedge and breaker).
    livelock_s: float = DEFAULT_LIVELOCK_S
    restart_on_wedge: bool = False
    # `--restart on-failure[:N]`: relaunch a server that died of a failure, under the same
    # breaker (max_restarts per restart_window_s), waiting restart_backoff_s (doubling).
    restart_on_death: bool = False
    restart_policy: str = DEFAULT_RESTART
    max_restarts: int = DEFAULT_MAX_RESTARTS
    restart_window_s: float = DEFAULT_RESTART_WINDOW_S
    restart_backoff_s: float = DEFAULT_RESTART_BACKOFF_S
    # How long a restart waits for the old server to stop, then for the new one to answer.
    stop_timeout_s: float = STOP_TIMEOUT_S
    ready_timeout_s: float = 600.0
    history_cap: int = 10_000
    # A dead server that nothing brings back (no restart policy) ends the monitor after this.
    dead_grace_s: float = 300.0
    image: str | None = None
    plan_hash: str | None = None
    # The plan's speculative decoding, shown beside the acceptance the engine reports.
    speculative_method: str | None = None
    speculative_tokens: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> MonitorSettings:
        if not isinstance(data, dict):
            return cls()
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomically(path, dataclasses.asdict(self))


def load_settings(path: Path) -> MonitorSettings:
    return MonitorSettings.from_dict(read_json(path))


# vLLM reads the API key from this variable; it is never written to disk with the spec.
API_KEY_VARIABLES = ("VLLM_API_KEY",)


def save_launch_spec(path: Path, spec: LaunchSpec) -> None:
    data = dataclasses.asdict(spec)
    data["argv"] = list(spec.argv)
    data["env"] = {k: v for k, v in spec.env.items() if k not in API_KEY_VARIABLES}
    data["api_key_env"] = [k for k in spec.env if k in API_KEY_VARIABLES]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, data)
    path.chmod(0o600)


def load_launch_spec(path: Path, api_key: str | None) -> LaunchSpec | None:
    """The saved launch spec, or None when there is none or it is not one launch wrote (a
    value of the wrong type would otherwise surface later, far from here, as a TypeError)."""
    data = read_json(path)
    if not isinstance(data, dict) or not _spec_types_hold(data):
        return None
    env = dict(data.get("env") or {})
    for variable in data.get("api_key_env") or []:
        if api_key:
            env[variable] = api_key
    known = {f.name for f in dataclasses.fields(LaunchSpec)}
    fields = {key: value for key, value in data.items() if key in known}
    fields["argv"] = tuple(fields.get("argv") or ())
    fields["env"] = env
    try:
        return LaunchSpec(**fields)
    except TypeError:
        return None


_SPEC_TEXT = ("name", "recipe", "host", "plan_hash", "served_model_name")
_SPEC_TEXT_OR_NONE = (
    "model_dir", "api_key_file", "engine", "engine_version", "engine_socket"
)  # fmt: skip


def _spec_types_hold(data: dict[str, Any]) -> bool:
    def texts(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)

    port = data.get("port")
    env = data.get("env") or {}
    return (
        all(isinstance(data.get(key), str) for key in _SPEC_TEXT)
        and all(isinstance(data.get(key), (str, type(None))) for key in _SPEC_TEXT_OR_NONE)
        and type(port) is int
        and 0 < port < 65536
        and texts(data.get("argv") or [])
        and texts(data.get("api_key_env") or [])
        and isinstance(env, dict)
        and all(isinstance(value, str) for value in env.values())
        and isinstance(data.get("container"), (dict, type(None)))
    )
