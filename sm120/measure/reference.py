"""Measured decode beside the recipe's published figure and the planner's roofline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def decode_against(
    report: Mapping[str, Any],
    published: Mapping[str, Any] | None,
    roofline_tok_s: float | None,
) -> dict[str, Any] | None:
    """Ratios of the measured single-stream decode to both references (None: nothing to
    compare, e.g. a --url target with no plan)."""
    measured = (report.get("decode") or {}).get("tps")
    if not isinstance(measured, (int, float)) or measured <= 0:
        return None
    published_tok_s = (published or {}).get("decode_tok_s")
    if not isinstance(published_tok_s, (int, float)) or published_tok_s <= 0:
        published_tok_s = None
    if published_tok_s is None and roofline_tok_s is None:
        return None
    return {
        "measured_decode_tok_s": measured,
        "published_decode_tok_s": published_tok_s,
        "published_source": (published or {}).get("source"),
        "of_published": measured / published_tok_s if published_tok_s else None,
        "roofline_decode_tok_s": roofline_tok_s,
        "of_roofline": measured / roofline_tok_s if roofline_tok_s else None,
    }
