"""The KV tier's capacity in tokens, from the same bytes per token as the GPU pool.

Both backends hold the tier in pinned (page-locked) host memory: vLLM's OffloadingConnector
allocates cpu_bytes_to_use for the whole server and splits it over the KV ranks, LMCache
allocates LMCACHE_MAX_LOCAL_CPU_SIZE in each worker (sm120 renders cpu_gib / ranks). A rank
stores the same bytes per token in host RAM as in its GPU pool, so the tier holds
cpu_gib / ranks / (bytes per token per rank) tokens; the disk tier likewise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sm120.plan.fit.kv import KVLayout
from sm120.recipe.schema import KvTier

GIB = 1024**3


@dataclass(frozen=True)
class TierCapacity:
    backend: str
    ranks: int
    pinned_gib: float  # host RAM the engine pins for the tier, whole server
    cpu_tokens: int
    disk_gib: float | None
    disk_tokens: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "ranks": self.ranks,
            "pinned_host_gib": self.pinned_gib,
            "cpu_tokens": self.cpu_tokens,
            "disk_gib": self.disk_gib,
            "disk_tokens": self.disk_tokens,
        }


def _tokens(gib: float, ranks: int, layout: KVLayout, context: int) -> int:
    return int(gib * GIB / ranks / layout.bytes_per_token(context))


def tier_capacity(tier: KvTier, layout: KVLayout, context: int, ranks: int) -> TierCapacity:
    return TierCapacity(
        backend=tier.backend,
        ranks=ranks,
        pinned_gib=tier.cpu_gib,
        cpu_tokens=_tokens(tier.cpu_gib, ranks, layout, context),
        disk_gib=tier.disk_gib,
        disk_tokens=None
        if tier.disk_gib is None
        else _tokens(tier.disk_gib, ranks, layout, context),
    )
