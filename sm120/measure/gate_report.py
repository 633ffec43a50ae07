"""Gate results as lines a person reads (one per case, failures indented under it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sm120.logs.failures import get


def _fmt(value: Any, unit: str, digits: int = 1) -> str | None:
    if not isinstance(value, (int, float)):
        return None
    return f"{value:,.{digits}f}{unit}"


def case_lines(result: Mapping[str, Any]) -> list[str]:
    mark = "PASS" if result["passed"] else "FAIL"
    turns = result.get("turns") or []
    last = turns[-1] if turns else {}
    figures = [
        f"TTFT {_fmt(last.get('ttft_s'), 's', 2)}" if last.get("ttft_s") is not None else None,
        f"prefill {_fmt(last.get('prefill_tps'), ' tok/s')}" if last.get("prefill_tps") else None,
        f"decode {_fmt(last.get('decode_tps'), ' tok/s')}" if last.get("decode_tps") else None,
        f"{last['prompt_tokens']:,} prompt tokens" if last.get("prompt_tokens") else None,
    ]
    shown = ", ".join(f for f in figures if f)
    head = f"{mark} {result['suite']}/{result['id']} ({result['api']}, {len(turns)} turns"
    head += f", {result['seconds']:.1f}s)" + (f"  {shown}" if shown else "")
    lines = [head]
    lines += [f"    - {failure}" for failure in result.get("failures") or []]
    lines += [f"    ~ {warning}" for warning in result.get("warnings") or []]
    return lines


def summary_line(report: Mapping[str, Any]) -> str:
    total = report["passed"] + report["failed"]
    word = "passed" if not report["failed"] else "FAILED"
    line = f"{report['suite']}: {report['passed']}/{total} cases passed - {word}"
    if report.get("random_model"):
        line += f"\n  random model: {report['random_model']}"
    return line


def known_failure_lines(report: Mapping[str, Any]) -> list[str]:
    """The catalogue's title and fix for each known failure mode the gate saw."""

    ids = sorted({i for case in report["cases"] for i in case.get("failure_ids") or []})
    lines = []
    for failure_id in ids:
        mode = get(failure_id)
        lines.append(f"{failure_id} {mode.title}. Fix: {mode.fix}")
    return lines


def prefix_cache_line(report: Mapping[str, Any]) -> str | None:
    """The share of the prompt tokens the engine's prefix cache served, when it counts them."""
    cache = report.get("prefix_cache")
    if not cache or cache.get("hit_rate") is None:
        return None
    return (
        f"prefix cache: {cache['hit_rate']:.0%} of {cache['queried_tokens']:,} prompt tokens "
        f"served from the cache ({cache['hit_tokens']:,} tokens)"
    )
