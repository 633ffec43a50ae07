"""What `sm120 status` reports about one deployment."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx

from sm120.core.net import client_url, http_url
from sm120.engine.cluster.record import load_record
from sm120.engine.find import runtime_for
from sm120.engine.log_follow import tail_lines as follow_tail
from sm120.engine.secrets import KeyFileError, read_api_key
from sm120.engine.state import DeploymentState, deployment_path
from sm120.monitor.files import MonitorFiles
from sm120.monitor.summary import monitor_summary
from sm120.server.client import BadServerResponse, ServerClient, bounded_request

# A status is a glance: each read gives up after this many seconds.
_READ_TIMEOUT = 5.0


def _age(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _metrics(base: str) -> dict[str, float | None]:
    """A few gauges and the prefix-cache counters from /metrics; the full parser belongs to
    the monitor."""
    wanted = {
        "vllm:kv_cache_usage_perc": "kv",
        "vllm:num_requests_running": "running",
        "vllm:num_requests_waiting": "waiting",
        # Prompt tokens looked up in / served from the prefix cache since the server started
        # (older releases spelled them with a gpu_ prefix).
        "vllm:prefix_cache_queries_total": "prefix_queries",
        "vllm:prefix_cache_hits_total": "prefix_hits",
        "vllm:gpu_prefix_cache_queries_total": "prefix_queries",
        "vllm:gpu_prefix_cache_hits_total": "prefix_hits",
    }
    try:
        with httpx.Client(timeout=_READ_TIMEOUT) as http:
            text = bounded_request(http, "GET", f"{base}/metrics").text
    except (httpx.HTTPError, BadServerResponse):
        return {}
    return parse_gauges(text, wanted)


def parse_gauges(text: str, wanted: dict[str, str]) -> dict[str, float | None]:
    """Each wanted series summed over its labels; None (unknown) where the engine wrote NaN
    or an infinity, which Prometheus text allows and no figure of ours can show."""
    found: dict[str, float | None] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in wanted or line.startswith("#"):
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (ValueError, IndexError):
            continue
        key = wanted[name]
        if key in found and found[key] is None:
            continue
        total = (found.get(key) or 0.0) + value
        found[key] = total if math.isfinite(total) else None
    return found


def _known(value: float | None, scale: float = 1.0) -> float | None:
    return None if value is None else value * scale


def _count(value: float | None) -> int | None:
    return None if value is None else int(value)


def _prefix_cache(metrics: dict[str, float | None]) -> dict[str, Any]:
    """The hit rate since the server started; None until a prompt has been looked up, or
    while a counter reads NaN."""
    if "prefix_queries" not in metrics:
        return {}
    queried = metrics["prefix_queries"]
    hits = metrics.get("prefix_hits", 0.0)
    if queried is None or hits is None:
        return {"prefix_cache_hit_pct": None, "prefix_cache_queried_tokens": None}
    return {
        "prefix_cache_hit_pct": hits / queried * 100 if queried else None,
        "prefix_cache_queried_tokens": int(queried),
    }


def describe(state: DeploymentState) -> dict[str, Any]:
    runtime = runtime_for(state)
    current = runtime.status(state)
    base = client_url(state.host, state.port)
    row: dict[str, Any] = {
        "name": state.name,
        "recipe": state.recipe,
        "runtime": state.runtime,
        "plan_hash": state.plan_hash,
        "running": current.running,
        "stale": current.stale,
        "pid": current.pid,
        "supervisor_pid": state.supervisor_pid,
        "since": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.started_at)),
        "uptime": _age(time.time() - state.started_at),
        "endpoint": http_url(state.host, state.port, "/v1"),
        "served_model_name": state.served_model_name,
        "log_path": state.log_path,
        "container": state.container_id[:12] if state.container_id else None,
    }
    if state.runtime == "cluster":
        record = load_record(state.name)
        row["nodes"] = [str(node["host"]) for node in record.nodes] if record else []
    if current.running:
        try:
            key = read_api_key(state.api_key_file)
        except KeyFileError as exc:
            # One deployment's damaged key file is its row's to name, not the whole status's.
            key, row["key_problem"] = None, exc.one_line()
        row["health"] = _health(base, key)
        metrics = _metrics(base)
        if "kv" in metrics:
            row["kv_cache_usage_pct"] = _known(metrics["kv"], 100)
            row["requests_running"] = _count(metrics.get("running", 0.0))
            row["requests_waiting"] = _count(metrics.get("waiting", 0.0))
        row.update(_prefix_cache(metrics))
    else:
        info = current.exit or runtime.exit_info(state)
        row["exit"] = info.describe() if info else "ended (exit status unknown)"
        row["exit_code"] = info.returncode if info else None
        row["exit_signal"] = info.signal if info else None
        row["ended"] = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.ended_at)) if info else None
        )
    row["monitor"] = monitor_summary(MonitorFiles(deployment_path(state.name)))
    # What the monitor last read of each GPU (empty without GPUs or a fresh monitor).
    row["gpus"] = row["monitor"]["gpus"]
    return row


def _health(base: str, key: str | None) -> int | None:
    """The status /health answers with, or None when nothing answers."""
    with ServerClient(base, key, timeout=_READ_TIMEOUT) as server:
        return server.health()


def tail_lines(path: str, count: int) -> tuple[list[str], int]:
    """The last `count` lines of the current serve.log and how many lines it has. Backups
    stay out: after a launch they hold the previous run, not this one."""
    return follow_tail(Path(path), count, max_backups=0)
