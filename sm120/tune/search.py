"""Which candidate to try next: one knob at a time, from the default.

Each knob's values are tried with the other knobs at the best found so far; the best of them
(or the value it had) is kept before the next knob moves, and the space's variants are tried
last, on top of the best settings. The order is a pure function of what was measured, so a
resumed search asks for the same candidates in the same order and skips those it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sm120.tune.space import Candidate, Space

Status = Literal["measured", "skipped", "failed"]


@dataclass
class Outcome:
    """What one candidate came to: measured (its samples), or skipped / failed with why."""

    candidate: Candidate
    status: Status
    samples: list[float] = field(default_factory=list)
    reason: str | None = None
    seconds: float = 0.0  # wall time it cost: launch, warm-up, measurement, stop

    @property
    def value(self) -> float | None:
        if self.status != "measured" or not self.samples:
            return None
        ordered = sorted(self.samples)
        middle = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[middle]
        return (ordered[middle - 1] + ordered[middle]) / 2

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.candidate.as_dict(),
            "status": self.status,
            "value": self.value,
            "samples": self.samples,
            "reason": self.reason,
            "seconds": round(self.seconds, 2),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outcome:
        settings = tuple((str(k), v) for k, v in dict(data.get("settings") or {}).items())
        candidate = Candidate(settings, data.get("variant"))
        return cls(
            candidate,
            data["status"],
            [float(x) for x in data.get("samples") or []],
            data.get("reason"),
            float(data.get("seconds") or 0.0),
        )


def better(a: float, b: float, higher_is_better: bool) -> bool:
    return a > b if higher_is_better else a < b


def _best(
    options: list[Candidate], outcomes: Mapping[str, Outcome], higher_is_better: bool
) -> Candidate:
    chosen, chosen_value = options[0], outcomes.get(options[0].key)
    best_value = chosen_value.value if chosen_value else None
    for option in options[1:]:
        found = outcomes.get(option.key)
        value = found.value if found else None
        if value is not None and (
            best_value is None or better(value, best_value, higher_is_better)
        ):
            chosen, best_value = option, value
    return chosen


def next_batch(
    space: Space, outcomes: Mapping[str, Outcome], higher_is_better: bool
) -> list[Candidate]:
    """The candidates to measure next that depend on nothing unmeasured (empty when the pass
    is complete): the default with the first knob's values (they start from the default
    whatever it measures), then each knob's values from the best so far, then the variants.
    Side by side, a batch starts at once; otherwise its candidates run one after another."""
    current = Candidate()
    pending = [] if current.key in outcomes else [current]
    for knob in space.knobs:
        options = [current.with_setting(knob.name, value) for value in knob.alternatives()]
        missing = [option for option in options if option.key not in outcomes]
        if pending or missing:
            return pending + missing
        current = _best([current, *options], outcomes, higher_is_better)
    variants = [Candidate(current.settings, variant) for variant in space.variants]
    return pending + [option for option in variants if option.key not in outcomes]


def next_candidate(
    space: Space, outcomes: Mapping[str, Outcome], higher_is_better: bool
) -> Candidate | None:
    """The next candidate to measure, or None when the pass is complete."""
    batch = next_batch(space, outcomes, higher_is_better)
    return batch[0] if batch else None


def leader(outcomes: Mapping[str, Outcome], higher_is_better: bool) -> Outcome | None:
    """The best measured candidate (the default wins a tie: it is what runs without tuning)."""
    measured = [o for o in outcomes.values() if o.value is not None]
    if not measured:
        return None
    best = next((o for o in measured if o.candidate.is_default), measured[0])
    for outcome in measured:
        value, best_value = outcome.value, best.value
        assert value is not None and best_value is not None
        if better(value, best_value, higher_is_better):
            best = outcome
    return best
