"""plan -> the engine's environment."""

from __future__ import annotations

from sm120.plan.resolve import LaunchPlan
from sm120.render.kv_tier import kv_ranks, kv_tier_env


def render_env(plan: LaunchPlan, *, api_key: str | None = None) -> dict[str, str]:
    """Recipe variables plus the API key. vLLM reads VLLM_API_KEY from its environment, which
    keeps the key out of argv (and so out of `ps` and logs); SGLang only takes --api-key."""
    env = {**plan.env_dict, **kv_tier_env(plan.kv_tier, kv_ranks(plan))}
    if api_key is not None and plan.engine == "vllm":
        env["VLLM_API_KEY"] = api_key
    return env
