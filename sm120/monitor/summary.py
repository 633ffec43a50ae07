"""What `sm120 status` shows of the monitor: peaks, the watchdog, the latest alerts. Reads
the monitor's files only, so it works whether or not the monitor runs."""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any

from sm120.monitor.files import MonitorFiles, load_settings
from sm120.monitor.peaks import iso_time, load_peaks, read_json
from sm120.monitor.process import running_monitor
from sm120.monitor.watchdog import breaker_state_from

# live.json older than this came from a monitor that no longer updates it.
STALE_AFTER_S = 120.0
# `status` text lists the newest few restarts; --json has every kept one with its log lines.
RESTARTS_SHOWN = 3


def monitor_summary(files: MonitorFiles) -> dict[str, Any]:
    settings = load_settings(files.settings)
    peaks = load_peaks(files.peak)
    breaker = breaker_state_from(read_json(files.watchdog))
    live = read_json(files.live)
    live = live if isinstance(live, dict) else {}
    now = time.time()
    window = settings.restart_window_s
    recent = [at for at in breaker.restarts if now - at < window]
    gave_up_at = breaker.gave_up_at
    updated_at = live.get("updated_at")
    fresh = (
        isinstance(updated_at, (int, float))
        and not isinstance(updated_at, bool)
        and now - updated_at < STALE_AFTER_S
    )
    watchdog = live.get("watchdog")
    return {
        "monitor_pid": running_monitor(files),
        "activity": live.get("activity") if fresh else None,
        "decode_tps": live.get("decode_tps") if fresh else None,
        "prefill_tps": live.get("prefill_tps") if fresh else None,
        # Per GPU: index, util_pct, power_w, power_limit_w, memory_used_mib, temperature_c.
        "gpus": _objects(live.get("gpus")) if fresh else [],
        "peaks": asdict(peaks) if peaks else None,
        "watchdog": {
            "restart_on_wedge": settings.restart_on_wedge,
            "restart_policy": settings.restart_policy,
            "restart_on_death": settings.restart_on_death,
            # closed: restarts allowed; open: it gave up until the next launch.
            "breaker": "open" if gave_up_at is not None else "closed",
            "wedge_timeout_s": settings.wedge_timeout_s,
            "restarts_in_window": len(recent),
            "max_restarts": settings.max_restarts,
            "window_h": window / 3600,
            "gave_up": gave_up_at is not None,
            "gave_up_at": iso_time(float(gave_up_at)) if gave_up_at is not None else None,
            "gave_up_reason": breaker.gave_up_reason,
            # Every restart kept: when, after what, why, and the server's last log lines.
            "restarts": [
                {**asdict(record), "at": iso_time(record.at)} for record in breaker.records
            ],
            "last_wedge": watchdog.get("last_wedge") if isinstance(watchdog, dict) else None,
        },
        "alerts": _objects(live.get("alerts"))[-3:],
        "kv_tier": live.get("kv_tier") if fresh else None,  # offload, load-back, hits by tier
    }


def _objects(value: Any) -> list[dict[str, Any]]:
    """The monitor writes lists of objects; a hand-edited or damaged file holds anything."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The monitor's part of `sm120 status`, as text."""
    lines = []
    pid = summary.get("monitor_pid")
    if pid:
        now = ""
        if summary.get("decode_tps") is not None:
            now = (
                f"; now prefill {summary.get('prefill_tps') or 0:,.1f}, "
                f"decode {summary['decode_tps']:,.1f} tok/s"
            )
        lines.append(
            f"  monitor   running (pid {pid}), {summary.get('activity') or 'starting'}{now}"
        )
    else:
        lines.append("  monitor   not running")
    peaks = summary.get("peaks")
    if peaks:
        lines.append(
            f"  peaks     prefill {peaks['peak_prefill_tps']:,.1f} tok/s, decode "
            f"{peaks['peak_decode_tps']:,.1f} tok/s, {peaks['peak_running']} running "
            f"(updated {peaks['updated'] or '-'})"
        )
    watchdog = summary["watchdog"]
    policy = "restarts on wedge" if watchdog["restart_on_wedge"] else "alerts only"
    lines.append(
        f"  watchdog  {policy}, {watchdog['restarts_in_window']}/{watchdog['max_restarts']} "
        f"restarts in {watchdog['window_h']:g} h, wedge after {watchdog['wedge_timeout_s']:g} s"
    )
    lines.append(f"  restart   policy {watchdog['restart_policy']}, breaker {watchdog['breaker']}")
    if watchdog["gave_up"]:
        lines.append(f"  GAVE UP   at {watchdog['gave_up_at']}: {watchdog['gave_up_reason']}")
    for record in watchdog["restarts"][-RESTARTS_SHOWN:]:
        last = record["log_tail"][-1] if record["log_tail"] else "(no log lines)"
        lines.append(f"  restarted {record['at']} {record['kind']}: {record['reason']}")
        lines.append(f"            last line: {last}")
    for gpu in summary.get("gpus") or []:
        lines.append(f"  GPU{gpu.get('index')}      {gpu_line(gpu)}")
    if watchdog.get("last_wedge"):
        lines.append(f"  wedge     diagnostics in {watchdog['last_wedge']}")
    for alert in summary.get("alerts") or []:
        lines.append(f"  alert     {alert.get('at')} {alert.get('kind')}: {alert.get('message')}")
    return lines


def gpu_line(gpu: dict[str, Any]) -> str:
    """`98% util, 512/600 W, 71 C, 40000/97887 MiB` for one GPU of live.json."""

    def value(key: str, unit: str = "") -> str:
        number = gpu.get(key)
        if not isinstance(number, (int, float)) or isinstance(number, bool):
            return "-"
        return f"{float(number):.0f}{unit}" if math.isfinite(number) else "-"

    return (
        f"{value('util_pct', '%')} util, {value('power_w')}/{value('power_limit_w', ' W')}, "
        f"{value('temperature_c', ' C')}, "
        f"{value('memory_used_mib')}/{value('memory_total_mib', ' MiB')}"
    )
