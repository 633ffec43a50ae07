"""`sm120 monitor`: a live view of what the monitor publishes in live.json."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sm120.monitor.files import MonitorFiles
from sm120.monitor.kv_tier import tier_line
from sm120.monitor.peaks import read_json
from sm120.monitor.process import running_monitor

_ACTIVITY_STYLE = {
    "serving": "green",
    "idle": "cyan",
    "compiling": "yellow",
    "stalled": "yellow",
    "wedged": "bold red",
    "livelock": "bold red",
    "dead": "bold red",
    "not answering": "red",
    "starting": "yellow",
}


def _number(value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{float(value):,.{digits}f}{unit}"


def _percent(fraction: Any) -> str:
    return _number(fraction * 100 if isinstance(fraction, (int, float)) else None, "%")


def render(live: dict[str, Any], name: str, monitor_pid: int | None) -> RenderableType:
    activity = str(live.get("activity") or "starting")
    style = _ACTIVITY_STYLE.get(activity, "white")
    phase = str(live.get("phase") or "-")
    if live.get("phase_detail"):
        phase += f" ({live['phase_detail']})"
    who = f"monitor pid {monitor_pid}" if monitor_pid else "monitor NOT running"
    header = Text.assemble(
        (f"{name}  ", "bold"),
        (activity.upper(), style),
        f"   phase {phase}   {who}   ",
        (f"updated {live.get('updated', '-')}", "dim"),
    )
    peaks = live.get("peaks") or {}
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
    for column in ("", "now", "peak"):
        table.add_column(column, justify="right" if column else "left")
    table.add_row(
        "prefill tok/s",
        _number(live.get("prefill_tps")),
        _number(peaks.get("peak_prefill_tps")),
    )
    table.add_row(
        "decode tok/s", _number(live.get("decode_tps")), _number(peaks.get("peak_decode_tps"))
    )
    table.add_row(
        "running / waiting",
        f"{_number(live.get('running'), digits=0)} / {_number(live.get('waiting'), digits=0)}",
        _number(peaks.get("peak_running"), digits=0),
    )
    table.add_row("KV cache usage", _number(live.get("kv_usage_pct"), "%"), "")
    acceptance = live.get("acceptance_rate")
    table.add_row(
        "spec-decode acceptance",
        f"{_number(acceptance * 100 if acceptance is not None else None, '%')}"
        f"  (mean length {_number(live.get('mean_acceptance_length'), digits=2)}"
        f"{_speculative_text(live.get('speculative'))})",
        "",
    )
    table.add_row(
        "prefix cache hits",
        f"{_percent(live.get('prefix_hit_rate'))}  ({_percent(live.get('prefix_hit_rate_total'))}"
        " since start)",
        "",
    )
    if live.get("kv_tier"):
        table.add_row("KV tier", tier_line(live["kv_tier"]), "")
    return Group(header, table, *_gpu_lines(live), _watchdog_line(live), *_alert_lines(live))


def _speculative_text(speculative: Any) -> str:
    """'/4 mtp': the plan's method, and the most the mean length can reach (every draft
    token accepted, plus the bonus token)."""
    if not isinstance(speculative, dict) or not speculative.get("method"):
        return ""
    tokens = speculative.get("num_speculative_tokens")
    return f"/{tokens + 1} {speculative['method']}" if tokens else ""


def _gpu_lines(live: dict[str, Any]) -> list[RenderableType]:
    gpus = [gpu for gpu in live.get("gpus") or [] if isinstance(gpu, dict)]
    if not gpus:
        return []
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
    for column in ("GPU", "util", "power", "memory", "temp"):
        table.add_column(column, justify="right")
    for gpu in gpus:
        limit = gpu.get("power_limit_w")
        power = _number(gpu.get("power_w"), " W", 0)
        if limit is not None:
            power += f" / {_number(limit, ' W', 0)}"
        memory = _number(gpu.get("memory_used_mib"), digits=0)
        if gpu.get("memory_total_mib") is not None:
            memory += f" / {_number(gpu.get('memory_total_mib'), ' MiB', 0)}"
        table.add_row(
            str(gpu.get("index")),
            _number(gpu.get("util_pct"), "%", 0),
            power,
            memory,
            _number(gpu.get("temperature_c"), " C", 0),
        )
    return [table]


def _watchdog_line(live: dict[str, Any]) -> Text:
    watchdog = live.get("watchdog") or {}
    policy = "restarts on wedge" if watchdog.get("restart_on_wedge") else "alerts only"
    text = Text(
        f"watchdog: {policy}; frozen {watchdog.get('frozen_for_s', 0):.0f}/"
        f"{watchdog.get('wedge_timeout_s', 0):g} s; restarts "
        f"{watchdog.get('restarts_in_window', 0)}/{watchdog.get('max_restarts', 0)} in "
        f"{watchdog.get('window_h', 0):g} h"
    )
    if watchdog.get("gave_up"):
        text.append(f"  GAVE UP: {watchdog.get('gave_up_reason')}", style="bold red")
    return text


def _alert_lines(live: dict[str, Any]) -> list[Text]:
    alerts = list(live.get("alerts") or [])[-5:]
    if not alerts:
        return [Text("no alerts", style="dim")]
    return [
        Text(f"{alert['at']} {alert['kind']}: {alert['message']}", style="red") for alert in alerts
    ]


def read_live(files: MonitorFiles) -> dict[str, Any] | None:
    live = read_json(files.live)
    return live if isinstance(live, dict) else None


def watch(files: MonitorFiles, name: str, console: Console, refresh_s: float = 1.0) -> None:
    """Redraw every refresh_s until Ctrl-C."""
    live = read_live(files) or {}
    with Live(render(live, name, running_monitor(files)), console=console) as screen:
        try:
            while True:
                time.sleep(refresh_s)
                live = read_live(files) or live
                screen.update(render(live, name, running_monitor(files)))
        except KeyboardInterrupt:
            return
