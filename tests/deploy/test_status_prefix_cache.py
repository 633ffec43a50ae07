"""sm120 status: the prefix cache's hit rate since start, from vLLM's counters."""

from __future__ import annotations

import pytest

from sm120.deploy.status import _prefix_cache
from sm120.monitor.poll_loop import prefix_hit_rate


def test_hit_rate_is_hits_over_lookups() -> None:
    assert _prefix_cache({"prefix_queries": 2000.0, "prefix_hits": 1500.0}) == {
        "prefix_cache_hit_pct": 75.0,
        "prefix_cache_queried_tokens": 2000,
    }


def test_no_lookups_yet_has_no_rate_and_no_counters_no_row() -> None:
    assert _prefix_cache({"prefix_queries": 0.0})["prefix_cache_hit_pct"] is None
    assert _prefix_cache({"kv": 0.1}) == {}


@pytest.mark.parametrize(
    ("counters", "rate"),
    [
        ({"prefix_queries": 400.0, "prefix_hits": 100.0}, 0.25),
        ({"prefix_queries": 400.0}, 0.0),
        ({"prefix_queries": 0.0, "prefix_hits": 0.0}, None),
        ({}, None),
    ],
)
def test_monitor_hit_rate(counters: dict[str, float], rate: float | None) -> None:
    assert prefix_hit_rate(counters) == rate
