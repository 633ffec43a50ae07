"""plan -> the engine's environment."""

from __future__ import annotations

from sm120.plan.resolve import LaunchPlan
from sm120.render.kv_tier import kv_ranks, kv_tier_env
from sm120.render.launcher import launcher_env


def render_env(
    plan: LaunchPlan,
    *,
    api_key: str | None = None,
    container_model_dir: str | None = None,
    bind_host: str | None = None,
) -> dict[str, str]:
    """Recipe variables plus the API key. vLLM reads VLLM_API_KEY from its environment, which
    keeps the key out of argv (and so out of `ps` and logs); SGLang only takes --api-key. A
    launcher route adds its knobs (the model folder and address as the container sees them)."""
    env = {
        **plan.env_dict,
        **kv_tier_env(plan.kv_tier, kv_ranks(plan)),
        **launcher_env(plan, container_model_dir=container_model_dir, bind_host=bind_host),
    }
    if api_key is not None and plan.engine == "vllm":
        env["VLLM_API_KEY"] = api_key
    return env
