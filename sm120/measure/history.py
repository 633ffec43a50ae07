"""Bench results over time, keyed by image and plan hash, and the regression verdict.

Two references, both optional:
  - the recipe's published baseline (the seeds' numbers, measured on the real hardware):
    decode tok/s against single-stream decode; prefill tok/s against the longest measured
    prompt, and only when that is a long prompt (the seeds quote prefill at 16k-64k, and a
    1k prompt never reaches those rates);
  - the previous run with the same key on this machine: decode, prefill per length and
    aggregate tok/s per concurrency level, whatever appears in both.
A figure more than `threshold` (a fraction) below its reference is a regression.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.paths import sm120_home
from sm120.engine.state import private_dir

HISTORY_FILE = "history.jsonl"
LONG_PROMPT_TOKENS = 32768
DEFAULT_THRESHOLD = 0.10


def history_path() -> Path:
    return sm120_home() / "bench" / HISTORY_FILE


def append(report: Mapping[str, Any], path: Path | None = None) -> Path:
    target = path or history_path()
    private_dir(target.parent)
    line = json.dumps(report, sort_keys=True, default=str) + "\n"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return target


def records(key: str, path: Path | None = None) -> list[dict[str, Any]]:
    """Earlier reports with this key, oldest first; unreadable lines are skipped."""
    return [record for record in _read(path or history_path()) if record.get("key") == key]


def all_records(path: Path | None = None) -> list[dict[str, Any]]:
    """Every readable report, oldest first (the dashboard charts them per deployment)."""
    return list(_read(path or history_path()))


def _read(path: Path) -> Iterator[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # a torn line, or one nested past the stack
            continue
        if isinstance(record, dict):
            yield record


@dataclass(frozen=True)
class Comparison:
    figure: str
    measured: float
    reference: float
    against: str
    """'baseline' (the recipe's published numbers) or 'previous' (the last run here)."""
    threshold: float

    @property
    def change(self) -> float:
        return self.measured / self.reference - 1.0

    @property
    def regression(self) -> bool:
        return self.change < -self.threshold

    def as_dict(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "measured": self.measured,
            "reference": self.reference,
            "against": self.against,
            "change": self.change,
            "regression": self.regression,
        }


def compare(
    report: Mapping[str, Any],
    baseline: Mapping[str, Any] | None,
    previous: Mapping[str, Any] | None,
    threshold: float = DEFAULT_THRESHOLD,
) -> list[Comparison]:
    found: list[Comparison] = []
    if baseline:
        found.extend(_against_baseline(report, baseline, threshold))
    if previous:
        found.extend(_against_previous(report, previous, threshold))
    return found


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _against_baseline(
    report: Mapping[str, Any], baseline: Mapping[str, Any], threshold: float
) -> Iterator[Comparison]:
    decode = _number((report.get("decode") or {}).get("tps"))
    published = _number(baseline.get("decode_tps"))
    if decode and published:
        yield Comparison("decode tok/s", decode, published, "baseline", threshold)
    published_prefill = _number(baseline.get("prefill_tps"))
    longest = max(
        report.get("prefill") or [], key=lambda p: p.get("prompt_tokens", 0), default=None
    )
    if published_prefill and longest and longest.get("prompt_tokens", 0) >= LONG_PROMPT_TOKENS:
        measured = _number(longest.get("prefill_tps"))
        if measured:
            figure = f"prefill tok/s @ {longest['prompt_tokens']}"
            yield Comparison(figure, measured, published_prefill, "baseline", threshold)


def _against_previous(
    report: Mapping[str, Any], previous: Mapping[str, Any], threshold: float
) -> Iterator[Comparison]:
    now, then = (
        _number((report.get("decode") or {}).get("tps")),
        _number((previous.get("decode") or {}).get("tps")),
    )
    if now and then:
        yield Comparison("decode tok/s", now, then, "previous", threshold)
    for sweep in _SWEEPS:
        yield from _point_by_point(report, previous, sweep, threshold)


# The sweeps compared point by point: (section, the key naming a point, the figure compared,
# the comparison's name for a point).
_SWEEPS = (
    ("prefill", "prompt_tokens", "prefill_tps", "prefill tok/s @ {}"),
    ("concurrency", "concurrency", "aggregate_tps", "aggregate tok/s @ C={}"),
)


def _point_by_point(
    report: Mapping[str, Any],
    previous: Mapping[str, Any],
    sweep: tuple[str, str, str, str],
    threshold: float,
) -> Iterator[Comparison]:
    """Each point of a sweep against the previous run's point with the same key."""
    section, key, metric, figure = sweep
    earlier = {point.get(key): point for point in previous.get(section) or []}
    for point in report.get(section) or []:
        old = earlier.get(point.get(key)) or {}
        measured, reference = _number(point.get(metric)), _number(old.get(metric))
        if measured and reference:
            yield Comparison(figure.format(point[key]), measured, reference, "previous", threshold)
