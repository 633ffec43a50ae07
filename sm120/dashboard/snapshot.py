"""What the page shows, as one JSON document: each deployment's `sm120 status --json` row
(whatever fields it gains flow through), the monitor's live view, its alerts split into
failure id and fix, the GPUs it uses, and its bench history against the recipe's published
figure and the roofline. Blocking work (state files, /health, /metrics): run it off the loop."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sm120.core.net import http_url
from sm120.deploy.monitoring import monitor_files
from sm120.deploy.status import describe
from sm120.deploy.tuned import all_results, gain_text
from sm120.engine.secrets import key_path, read_api_key
from sm120.engine.state import (
    DeploymentState,
    StateError,
    deployment_dir,
    deployments_root,
    is_deployment_name,
    load_state,
)
from sm120.measure import history
from sm120.monitor.files import MonitorFiles, load_launch_spec
from sm120.monitor.peaks import iso_time, read_json

# The page charts this many bench runs per deployment, newest last.
BENCH_RUNS_SHOWN = 20
ALERTS_SHOWN = 10
# A row is a few levels deep; a file nested past this is damaged, and its row says so.
ROW_DEPTH = 16
# The monitor words a catalogue failure "F08 title. Fix: the fix" (monitor/poll_loop.py).
_FAILURE = re.compile(r"^(?P<id>[A-Z]+\d+)\s+(?P<title>.*?)\.\s+Fix:\s+(?P<fix>.*)$")


Describe = Callable[[DeploymentState], dict[str, Any]]


def snapshot(
    sleepers: dict[str, bool],
    gateway: dict[str, object] | None,
    status_row: Describe = describe,
) -> dict[str, Any]:
    """`sleepers`: each deployment that can sleep, and whether it sleeps now; `status_row`:
    a running deployment's `sm120 status --json` row (routes.py hands in a cached one)."""
    rows = [_guarded(folder, sleepers, status_row) for folder in _deployment_folders()]
    deployments = [row for row in rows if row is not None]
    bench = _bench_by_deployment()
    aliases = _aliases_by_deployment(gateway)
    for row in deployments:
        row["bench"] = bench.get(row["name"], [])[-BENCH_RUNS_SHOWN:]
        # The gateway's aliases (`sm120 status --json`'s gateway line), unless the row has its own.
        row.setdefault("aliases", aliases.get(row["name"], []))
    return {
        "updated": iso_time(time.time()),
        "deployments": deployments,
        "gateway": gateway,
        "gpus": _gpus(deployments),
        "tuned": [tuned_row(document) for document in all_results()],
    }


def tuned_row(document: dict[str, Any]) -> dict[str, Any]:
    """One `sm120 tune` result kept on this host, as the page's table shows it (read from the
    file only: the GPUs are not read on every poll to compare fingerprints)."""
    leader, default = document.get("leader") or {}, document.get("default") or {}
    fingerprint = document.get("fingerprint") or {}
    gpus = ", ".join(fingerprint.get("gpu_models") or ["CPU"])
    return {
        "key": document.get("key"),
        "objective": document.get("objective_label"),
        "unit": document.get("unit"),
        "gain": gain_text(document),
        "tuned": leader.get("value"),
        "default": default.get("value"),
        "settings": (document.get("winner") or {}).get("sets", []),
        "when": iso_time(float(document.get("finished_at") or 0)),
        "host": f"{fingerprint.get('gpu_count', 0)}x {gpus}, {fingerprint.get('engine_ref', '')}",
    }


def _deployment_folders() -> list[Path]:
    root = deployments_root()
    if not root.is_dir():
        return []
    return [p for p in sorted(root.iterdir()) if p.is_dir() and is_deployment_name(p.name)]


def _unreadable(name: str, problem: str) -> dict[str, Any]:
    return {
        "name": name,
        "running": False,
        "phase": "unreadable",
        "error": problem,
        "alerts": [],
        "bench": [],
        "gpu_indices": [],
    }


def _guarded(
    folder: Path, sleepers: dict[str, bool], status_row: Describe
) -> dict[str, Any] | None:
    """One folder's row; whatever is wrong inside one folder (a damaged file, a value of the
    wrong type) is named in that row and the others are shown as they are, as the gateway
    does (gateway/backends.py: discover)."""
    try:
        row = _deployment(folder, sleepers, status_row)
        return None if row is None else plain_json(row)
    except StateError as exc:
        return _unreadable(folder.name, exc.one_line())
    except Exception as exc:  # any defect in one folder stays in that folder
        detail = " ".join(str(exc).split())[:160]
        return _unreadable(folder.name, f"{type(exc).__name__}: {detail}")


def plain_json(value: Any, depth: int = 0) -> Any:
    """`value` as JSON a browser parses: NaN and infinities (Python writes them, JSON has
    none) become null, anything past ROW_DEPTH levels is refused."""
    if depth > ROW_DEPTH:
        raise ValueError(f"nested deeper than {ROW_DEPTH} levels")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): plain_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v, depth + 1) for v in value]
    return value


def _deployment(
    folder: Path, sleepers: dict[str, bool], status_row: Describe
) -> dict[str, Any] | None:
    name = folder.name
    state = load_state(name)
    spec_file = monitor_files(name).launch_spec
    spec = load_launch_spec(spec_file, _key(name, state))
    if state is None:
        if spec is None and spec_file.exists():
            raise StateError(
                f"launch record {spec_file} is unusable (damaged, or not one sm120 wrote)",
                f"launch it again with 'sm120 launch <recipe> --name {name}'",
            )
        if spec is None:
            return None
        # Stopped, but its launch spec lets the gateway (or Relaunch) start it again.
        row: dict[str, Any] = {
            "name": name,
            "recipe": spec.recipe,
            "running": False,
            "endpoint": http_url(spec.host, spec.port, "/v1"),
            "served_model_name": spec.served_model_name,
            "monitor": {},
        }
    else:
        row = dict(status_row(state))
    live = read_json(MonitorFiles(deployment_dir(name)).live)
    live = live if isinstance(live, dict) and state is not None else {}
    row["live"] = {k: v for k, v in live.items() if k not in ("alerts", "gpus", "watchdog")}
    row["phase"] = _phase(row, live)
    row["can_sleep"] = name in sleepers
    row["asleep"] = sleepers.get(name, False)
    row["alerts"] = _alerts(live.get("alerts"))
    row["gpu_indices"] = _gpu_indices(spec.env if spec else {}, row)
    return row


def _key(name: str, state: Any) -> str | None:
    return read_api_key(state.api_key_file if state else str(key_path(name)))


def _phase(row: dict[str, Any], live: dict[str, Any]) -> str:
    if not row.get("running"):
        return "stopped"
    return str(live.get("phase") or ("ready" if row.get("health") == 200 else "starting"))


def _alerts(alerts: Any) -> list[dict[str, Any]]:
    """The newest alerts; the monitor writes a list of objects, anything else is not one."""
    if not isinstance(alerts, list):
        return []
    return [_alert(a) for a in alerts if isinstance(a, dict)][-ALERTS_SHOWN:]


def _alert(alert: dict[str, Any]) -> dict[str, Any]:
    message = str(alert.get("message", ""))
    found = _FAILURE.match(message) if alert.get("kind") == "failure" else None
    parts = found.groupdict() if found else {"id": None, "title": None, "fix": None}
    return {**alert, "failure_id": parts["id"], "fix": parts["fix"]}


def _gpu_indices(env: Any, row: dict[str, Any]) -> list[int]:
    visible = str(env.get("CUDA_VISIBLE_DEVICES", "")) if env else ""
    if visible:
        return [int(part) for part in visible.split(",") if part.strip().isdigit()]
    return [gpu["index"] for gpu in _gpu_list(row) if "index" in gpu]


def _gpu_list(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The row's GPUs whose index is a small integer: one monitor's odd reading must not
    break the GPU table of every deployment."""
    gpus = row.get("gpus")
    if not isinstance(gpus, list):
        return []
    return [
        gpu
        for gpu in gpus
        if isinstance(gpu, dict)
        and ("index" not in gpu or (type(gpu["index"]) is int and 0 <= gpu["index"] < 1024))
    ]


def _gpus(deployments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each GPU once (several deployments' monitors read the same GPUs), naming its users."""
    found: dict[int, dict[str, Any]] = {}
    for row in deployments:
        for gpu in _gpu_list(row):
            index = int(gpu.get("index", -1))
            entry = found.setdefault(index, {**gpu, "deployments": []})
            entry["deployments"].append(row["name"])
    return [found[index] for index in sorted(found)]


def _aliases_by_deployment(gateway: dict[str, object] | None) -> dict[str, list[str]]:
    table = (gateway or {}).get("aliases")
    found: dict[str, list[str]] = {}
    if isinstance(table, dict):
        for name, deployment in sorted(table.items()):
            found.setdefault(str(deployment), []).append(str(name))
    return found


def _bench_by_deployment() -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for record in history.all_records():
        name = record.get("deployment")
        if isinstance(name, str):
            runs.setdefault(name, []).append(_bench_point(record))
    return runs


def _bench_point(record: dict[str, Any]) -> dict[str, Any]:
    decode = _mapping(record.get("decode"))
    against = _mapping(record.get("against"))
    point = {
        "time": record.get("time"),
        "mode": record.get("mode"),
        "decode_tok_s": decode.get("tps"),
        "ttft_s": decode.get("ttft_s"),
        "published_decode_tok_s": against.get("published_decode_tok_s"),
        "published_source": against.get("published_source"),
        "roofline_decode_tok_s": against.get("roofline_decode_tok_s"),
    }
    # A history line someone edited by hand holds anything: the chart takes numbers and text.
    return {key: _scalar(value) for key, value in point.items()}


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _scalar(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value if isinstance(value, (str, int)) else None
