"""`sm120 gateway analyze`: what changes between one turn and the next of a session in the
request log (sm120.gateway.requestlog), and the prefix-cache hits it costs.

A prefix cache serves a prompt only up to its first token that differs from an earlier one.
A session's turn N+1 should start with all of turn N's prompt; whatever changed before that
point (a timestamp in the system prompt, tools in another order, an earlier message edited)
is where the cache stops. For each turn the analyzer finds the first change, names it, and
says what share of the prompt could have come from the cache and what share still can: the
difference is what the change costs. It is read against the engine's own counters
(vLLM's prefix_cache_hits/queries, as `sm120 status` reads them) and, where the engine
reports them, the cached tokens of each answer.

Sessions: requests of one key and one model whose first message is the same.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sm120.core.bounded import capped_lines
from sm120.core.errors import SM120Error
from sm120.core.terminal import terminal_safe
from sm120.deploy.status import describe
from sm120.engine.state import StateError, list_states
from sm120.gateway.requestlog import log_files

MAX_LINE_BYTES = 4 << 20
# Order of a prompt as chat templates render it: the system prompt, tools, then messages.
ORDER = ("system", "tools", "messages")


class AnalyzeError(SM120Error):
    """The request log cannot be analysed."""


def read_rows(path: Path, key: str | None) -> Iterator[dict[str, Any]]:
    files = log_files(path)
    if not files:
        raise AnalyzeError(
            f"no request log at {path}",
            "start the gateway with --request-log and let a session run (sm120 gateway start)",
        )
    for file in files:
        with file.open("rb") as handle:
            for raw in capped_lines(handle, MAX_LINE_BYTES):
                try:
                    row = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(row, dict) and (key is None or row.get("key") == key):
                    yield row


def sessions(rows: Iterator[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    grouped: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        messages = row.get("messages") or []
        first = messages[0][2] if messages and isinstance(messages[0], list) else ""
        grouped.setdefault((str(row.get("key")), str(row.get("model")), first), []).append(row)
    return [turns for turns in grouped.values() if len(turns) > 1]


def _length(row: dict[str, Any]) -> int:
    return int(
        int(row["system"]["len"])
        + sum(t[0] for t in row["tools"])
        + sum(m[1] for m in row["messages"])
    )


def first_change(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, int] | None:
    """What changed first, in prompt order, between two turns, and how many characters of the
    later prompt come before it; None when the later turn starts with all of the earlier."""
    at = 0
    sys_a, sys_b = before["system"], after["system"]
    if sys_a["hash"] != sys_b["hash"]:
        for index, (line_a, line_b) in enumerate(zip(sys_a["lines"], sys_b["lines"], strict=False)):
            if line_a[1] != line_b[1]:
                flags = set(line_b[2:]) | set(line_a[2:])
                what = "text"
                if "billing" in flags:
                    what = "Claude Code's billing header"
                elif flags & {"time", "date"}:
                    what = "a timestamp"
                elif "id" in flags:
                    what = "an id"
                return f"{what} in the system prompt (line {index + 1})", at
            at += line_b[0] + 1
        return "the system prompt's length", at
    at += int(sys_b["len"])
    tools_a = [t[1] for t in before["tools"]]
    tools_b = [t[1] for t in after["tools"]]
    if tools_a != tools_b:
        if sorted(tools_a) == sorted(tools_b):
            what = "reordered tools"
        else:
            added = len(set(tools_b) - set(tools_a))
            removed = len(set(tools_a) - set(tools_b))
            what = f"tools changed ({added} new or edited, {removed} gone)"
        for tool_a, tool_b in zip(before["tools"], after["tools"], strict=False):
            if tool_a[1] != tool_b[1]:
                break
            at += tool_b[0]
        return what, at
    at += sum(t[0] for t in after["tools"])
    for index, message_a in enumerate(before["messages"]):
        if index >= len(after["messages"]):
            return "messages dropped from the conversation", at
        message_b = after["messages"][index]
        if message_a[2] != message_b[2]:
            return f"an edited earlier message (#{index + 1}, {message_b[0]})", at
        at += message_b[1]
    return None


def analyze_session(turns: list[dict[str, Any]]) -> dict[str, Any]:
    findings: list[dict[str, Any]] = []
    lost_sum = 0.0
    for n, (before, after) in enumerate(itertools.pairwise(turns), start=2):
        total = max(_length(after), 1)
        could = min(_length(before), total) / total
        change = first_change(before, after)
        if change is None:
            continue
        what, kept_chars = change
        kept = kept_chars / total
        lost_sum += could - kept
        findings.append(
            {"turn": n, "change": what, "cacheable_pct": round(could * 100, 1),
             "kept_pct": round(kept * 100, 1)}
        )  # fmt: skip
    prompt = sum(r.get("prompt_tokens") or 0 for r in turns[1:])
    cached = sum(r.get("cached_tokens") or 0 for r in turns[1:])
    reported = any(r.get("cached_tokens") is not None for r in turns[1:])
    changes = sorted({f["change"].split(" (")[0] for f in findings})
    return {
        "key": turns[0].get("key"),
        "model": turns[0].get("model"),
        "turns": len(turns),
        "changes": changes,
        "findings": findings,
        # The prompt share the changes cost, averaged over the session's later turns.
        "cost_pct": round(lost_sum / (len(turns) - 1) * 100, 1),
        "engine_cached_pct": round(cached / prompt * 100, 1) if reported and prompt else None,
    }


def engine_counters(models: set[str]) -> dict[str, dict[str, Any]]:
    """Each running deployment's prefix-cache hit rate since it started (`sm120 status`'s)."""
    found: dict[str, dict[str, Any]] = {}
    try:
        states = list_states()
    except StateError:
        return found
    for state in states:
        if state.served_model_name not in models:
            continue
        row = describe(state)
        if row.get("prefix_cache_hit_pct") is not None:
            found[state.served_model_name] = {
                "deployment": state.name,
                "hit_pct": round(row["prefix_cache_hit_pct"], 1),
                "queried_tokens": row["prefix_cache_queried_tokens"],
            }
    return found


def analyze_log(path: Path, key: str | None, with_engines: bool = True) -> dict[str, Any]:
    found = [analyze_session(turns) for turns in sessions(read_rows(path, key))]
    models = {str(s["model"]) for s in found}
    return {"sessions": found, "engines": engine_counters(models) if with_engines else {}}


def render_analysis(report: dict[str, Any]) -> str:
    if not report["sessions"]:
        return "no session of two turns or more in the request log yet"
    lines: list[str] = []
    for session in report["sessions"]:
        head = f"key {session['key']}, model {session['model']}: {session['turns']} turns"
        if not session["findings"]:
            lines.append(f"{head}; each turn starts with the whole previous prompt")
            continue
        lines.append(
            f"{head}; changes cost ~{session['cost_pct']}% of each prompt's prefix-cache hits"
        )
        for finding in session["findings"][:10]:
            lines.append(
                f"  turn {finding['turn']}: {finding['change']}: "
                f"{finding['kept_pct']}% of the prompt can come from the cache, "
                f"{finding['cacheable_pct']}% could"
            )
        if session["engine_cached_pct"] is not None:
            lines.append(f"  the engine reported {session['engine_cached_pct']}% of it cached")
    for model, engine in report["engines"].items():
        lines.append(
            f"engine {engine['deployment']} ({model}): prefix cache {engine['hit_pct']}% of "
            f"{engine['queried_tokens']:,} prompt tokens since it started"
        )
    return "\n".join(terminal_safe(line) for line in lines)
