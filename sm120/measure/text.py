"""Deterministic English filler: haystacks for recall gates, token pools for benchmarks.

Plain, varied sentences (no repeated paragraph a model could learn to skip) generated from a
seed, so a failing gate can be rerun on exactly the same text.
"""

from __future__ import annotations

import random

_SUBJECTS = (
    "the harbour master",
    "a quiet engineer",
    "the night clerk",
    "an old surveyor",
    "the ferry captain",
    "a visiting botanist",
    "the station cook",
    "a junior archivist",
    "the lighthouse keeper",
    "a travelling merchant",
    "the village baker",
    "a retired pilot",
)
_VERBS = (
    "inspected",
    "repaired",
    "counted",
    "painted",
    "described",
    "measured",
    "carried",
    "catalogued",
    "photographed",
    "weighed",
    "cleaned",
    "sketched",
)
_OBJECTS = (
    "the wooden crates",
    "a set of brass valves",
    "the eastern fence",
    "several maps",
    "the cargo manifests",
    "a broken barometer",
    "the linen sails",
    "two iron anchors",
    "the garden beds",
    "a box of candles",
    "the signal lamps",
    "the rain gauges",
)
_PLACES = (
    "near the north pier",
    "behind the customs house",
    "beside the grain store",
    "under the old bridge",
    "at the edge of the marsh",
    "inside the boat shed",
    "along the coastal road",
    "next to the chapel",
    "by the tide pools",
    "in the upper yard",
)
_TIMES = (
    "before dawn",
    "after the storm",
    "during the market",
    "late in the evening",
    "on the second morning",
    "while the tide was low",
    "just after noon",
    "at first light",
)


def sentences(seed: int) -> list[str]:
    """An endless-feeling but reproducible supply; callers slice what they need."""
    rng = random.Random(seed)
    out = []
    for _ in range(4000):
        subject, verb, obj = rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)
        place, when = rng.choice(_PLACES), rng.choice(_TIMES)
        number = rng.randint(2, 97)
        out.append(
            f"{subject.capitalize()} {verb} {obj} {place} {when}, "
            f"noting {number} details in the daily record."
        )
    return out


def filler(seed: int, count: int) -> list[str]:
    """`count` sentences; long haystacks cycle the supply with a shifted seed."""
    out: list[str] = []
    round_ = 0
    while len(out) < count:
        out.extend(sentences(seed + round_ * 7919))
        round_ += 1
    return out[:count]


def vocabulary_sample() -> str:
    """Text that covers many different tokens: the source of benchmark token pools."""
    words = {w for group in (_SUBJECTS, _VERBS, _OBJECTS, _PLACES, _TIMES) for w in group}
    extra = "0 1 2 3 4 5 6 7 8 9 ; : , . ? ! ( ) [ ] { } = + - * / # @ % & quick brown fox"
    return " ".join(sorted(words)) + " " + extra + " " + " ".join(sentences(17)[:40])
