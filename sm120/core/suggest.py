"""Did-you-mean for names the user typed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, candidates: Iterable[str]) -> str | None:
    pool = list(candidates)
    lowered = {c.lower(): c for c in pool}
    if word.lower() in lowered:
        return lowered[word.lower()]
    hits = difflib.get_close_matches(word, pool, n=1, cutoff=0.6)
    if not hits:
        hits = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
        hits = [lowered[h] for h in hits]
    return hits[0] if hits else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """' — did you mean 'x'?' or '' when nothing is close."""
    hit = closest(word, candidates)
    return f"; did you mean '{hit}'?" if hit else ""
