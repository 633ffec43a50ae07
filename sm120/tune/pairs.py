"""The leader against the default, measured alternately, and what the pairs allow one to say.

Each pair is one figure of each, taken back to back (the order swaps every pair, so a drift
of the machine favours neither). The change of a pair is the leader's figure against the
default's, signed so that + is better whatever the objective's direction. The reported gain
is the median change; the noise is how far the pairs spread around it. A gain is claimed only
when every pair agrees that the leader is better - the lowest change above zero - which with
two or more pairs means the median lies further from zero than the noise reaches.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

MIN_PAIRS_FOR_A_GAIN = 2


@dataclass(frozen=True)
class Pair:
    default: float
    leader: float
    leader_first: bool
    leader_key: str = ""  # which leader: a search that goes on may crown another

    def change(self, higher_is_better: bool) -> float:
        """Fractional change, + better: 0.12 is 12% more tok/s, or 12% less TTFT."""
        if self.default == 0:
            return 0.0
        ratio = self.leader / self.default
        return ratio - 1.0 if higher_is_better else 1.0 - ratio

    def as_dict(self) -> dict[str, Any]:
        return {
            "default": self.default,
            "leader": self.leader,
            "leader_first": self.leader_first,
            "leader_key": self.leader_key,
        }


def verdict(pairs: list[Pair], higher_is_better: bool) -> dict[str, Any]:
    """The median change with its spread, and whether it is a gain beyond the noise."""
    if not pairs:
        return {"gain": False, "pairs": 0, "why": "no pairs were measured"}
    changes = [pair.change(higher_is_better) for pair in pairs]
    median = statistics.median(changes)
    noise = max(abs(change - median) for change in changes)
    gain = len(pairs) >= MIN_PAIRS_FOR_A_GAIN and min(changes) > 0
    if gain:
        why = f"every one of {len(pairs)} pairs favours the leader"
    elif len(pairs) < MIN_PAIRS_FOR_A_GAIN:
        why = "one pair measures no noise: not claimed as a gain"
    else:
        why = "inside the noise: the pairs disagree"
    return {
        "gain": gain,
        "pairs": len(pairs),
        "change_pct": round(median * 100, 2),
        "noise_pct": round(noise * 100, 2),
        "lowest_pct": round(min(changes) * 100, 2),
        "highest_pct": round(max(changes) * 100, 2),
        "why": why,
    }
