"""`sm120 gateway usage`: usage.db read back, grouped, as a table or JSON."""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error
from sm120.core.terminal import terminal_safe
from sm120.gateway.usage import GROUPS, summary

_AGO = re.compile(r"(\d{1,6})([mhd])")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400}


class UsageError(SM120Error):
    """`gateway usage` was asked something it cannot answer."""


def parse_since(text: str | None, now: float | None = None) -> float | None:
    if text is None:
        return None
    now = time.time() if now is None else now
    ago = _AGO.fullmatch(text)
    if ago:
        return now - int(ago.group(1)) * _UNIT_S[ago.group(2)]
    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--since '{text[:40]}' is neither a day nor a time ago",
            "write YYYY-MM-DD, or 30m, 12h, 7d",
        ) from None
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp()


def usage_rows(path: Path, by: str, since: str | None) -> list[dict[str, Any]]:
    if by not in GROUPS:
        raise UsageError(f"--by '{by[:40]}' is not a grouping", f"use one of {', '.join(GROUPS)}")
    start = parse_since(since)
    if not path.is_file():
        raise UsageError(
            f"no usage recorded yet ({path} does not exist)",
            "the gateway records usage once it has served a request (sm120 gateway start)",
        )
    try:
        return summary(path, by, start)
    except sqlite3.Error as exc:
        raise UsageError(f"cannot read {path}: {exc}", "is it sm120's usage.db?") from None


def render_usage(rows: list[dict[str, Any]], by: str) -> str:
    if not rows:
        return "no requests in that time"
    header = (
        f"{by:<24} {'requests':>9} {'errors':>7} {'prompt':>10} {'cached':>10} "
        f"{'output':>10} {'ttft ms':>8}"
    )
    lines = [header]
    for row in rows:
        ttft = "-" if row["mean_ttft_ms"] is None else f"{row['mean_ttft_ms']:.0f}"
        # A key name or a model is whatever a client or an admin wrote: shown inert.
        label = terminal_safe(str(row[by]))[:24]
        lines.append(
            f"{label:<24} {row['requests']:>9} {row['errors']:>7} {row['prompt_tokens']:>10} "
            f"{row['cached_tokens']:>10} {row['completion_tokens']:>10} {ttft:>8}"
        )
    return "\n".join(lines)
