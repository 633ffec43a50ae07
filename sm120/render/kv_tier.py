"""plan.kv_tier -> the engine's own flags and variables for a KV tier beyond the GPU.

native: vLLM's --kv-offloading-backend native --kv-offloading-size GIB (vllm/config/vllm.py
turns them into the OffloadingConnector with cpu_bytes_to_use for the whole server).
lmcache: the LMCacheConnectorV1 connector named in --kv-transfer-config, sized by LMCACHE_*
variables. Not `--kv-offloading-backend lmcache`: vLLM's newer mains map that to
LMCacheMPConnector, which needs a separate LMCache server, and it cannot name a disk tier.
LMCache reads its variables in every worker, so the sizes it gets are per rank.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sm120.plan.resolve import LaunchPlan
    from sm120.recipe.schema import KvTier

LMCACHE_CONNECTOR = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
# LMCache's own default chunk (tokens per stored object), stated so the render is explicit.
LMCACHE_CHUNK_TOKENS = 256


def _gib(value: float) -> str:
    return f"{value:g}"


def kv_ranks(plan: LaunchPlan) -> int:
    """The engine's KV ranks (TP x PP): the tier's size is split over them."""
    tp = plan.arg("tensor-parallel-size", 1)
    pp = plan.arg("pipeline-parallel-size", 1)
    return (tp if isinstance(tp, int) else 1) * (pp if isinstance(pp, int) else 1)


def kv_tier_argv(tier: KvTier | None) -> list[str]:
    if tier is None:
        return []
    if tier.backend == "native":
        return ["--kv-offloading-backend", "native", "--kv-offloading-size", _gib(tier.cpu_gib)]
    return ["--kv-transfer-config", json.dumps(LMCACHE_CONNECTOR, separators=(",", ":"))]


def kv_tier_env(tier: KvTier | None, ranks: int) -> dict[str, str]:
    if tier is None or tier.backend != "lmcache":
        return {}
    env = {
        "LMCACHE_CHUNK_SIZE": str(LMCACHE_CHUNK_TOKENS),
        "LMCACHE_LOCAL_CPU": "True",
        "LMCACHE_MAX_LOCAL_CPU_SIZE": _gib(round(tier.cpu_gib / ranks, 3)),
    }
    if tier.disk_path is not None and tier.disk_gib is not None:
        env["LMCACHE_LOCAL_DISK"] = f"file://{tier.disk_path.rstrip('/')}/"
        env["LMCACHE_MAX_LOCAL_DISK_SIZE"] = _gib(round(tier.disk_gib / ranks, 3))
    return env


def kv_tier_disk(tier: KvTier | None) -> str | None:
    """The host folder a container must mount (at the same path) for LMCache's disk tier."""
    return tier.disk_path if tier is not None else None
