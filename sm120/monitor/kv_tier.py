"""The KV tier as /metrics tells it: bytes offloaded to host RAM and loaded back, and the
prefix hit rate split by tier, from the counters metrics.py reads (since the server started).

vLLM counts prefix-cache hits on the GPU (`vllm:prefix_cache_*`) apart from those the KV
connector serves (`vllm:external_prefix_cache_*`: the native tier's or LMCache's), both in
tokens; the native tier's transfers are `vllm:kv_offload_{store,load}_bytes` (before vLLM
0.30 one `vllm:kv_offload_total_bytes` counter labelled by transfer_type); LMCache adds its
own `lmcache:num_hit_tokens` / `num_requested_tokens` where its metrics reach /metrics.
"""

from __future__ import annotations

from typing import Any

GIB = 1024**3
# Counters only a server with a KV tier exposes (external_prefix_cache_* exist on every one).
TIER_KEYS = ("tier_store_bytes", "tier_load_bytes", "lmcache_requested_tokens")


def _ratio(hits: float | None, queries: float | None) -> float | None:
    if hits is None or not queries:
        return None
    return round(hits / queries, 4)


def _gib(value: float | None) -> float | None:
    return None if value is None else round(value / GIB, 3)


def tier_view(counters: dict[str, float]) -> dict[str, Any] | None:
    """What status --json, the live view and live.json show; None without a tier."""
    if not any(key in counters for key in TIER_KEYS):
        return None
    return {
        "offloaded_gib": _gib(counters.get("tier_store_bytes")),
        "loaded_back_gib": _gib(counters.get("tier_load_bytes")),
        "gpu_hit_rate": _ratio(counters.get("prefix_hits"), counters.get("prefix_queries")),
        "tier_hit_rate": _ratio(counters.get("tier_hits"), counters.get("tier_queries")),
        "tier_hit_tokens": counters.get("tier_hits"),
        "lmcache_hit_rate": _ratio(
            counters.get("lmcache_hit_tokens"), counters.get("lmcache_requested_tokens")
        ),
    }


def tier_line(view: dict[str, Any]) -> str:
    def pct(value: Any) -> str:
        return "-" if value is None else f"{value * 100:.1f}%"

    def gib(value: Any) -> str:
        return "-" if value is None else f"{value:.2f} GiB"

    text = (
        f"offloaded {gib(view.get('offloaded_gib'))}, loaded back "
        f"{gib(view.get('loaded_back_gib'))}; prefix hits GPU {pct(view.get('gpu_hit_rate'))}, "
        f"tier {pct(view.get('tier_hit_rate'))}"
    )
    if view.get("lmcache_hit_rate") is not None:
        text += f", LMCache {pct(view['lmcache_hit_rate'])}"
    return text
