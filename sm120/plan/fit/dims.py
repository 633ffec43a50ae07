"""Model dimensions for the planner: from the checkpoint when --model-dir holds a config.json,
else from the recipe's `model.dims`.

This is the planner's only I/O: config.json, hf_quant_config.json and the sizes of the
weight files. Architecture fields come from config.json; the engine fields (block size,
which layers own an indexer cache) only exist in the recipe, which pins the image.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sm120.core.bounded import read_json_capped
from sm120.core.errors import PlanError, SM120Error
from sm120.core.yaml_data import load_yaml
from sm120.plan.derive import MAX_CONFIG_BYTES, derive_index_topk_pattern, read_config
from sm120.recipe.schema import ModelDims

_CONFIG_HINT = "re-download the checkpoint"

GIB = 1024**3
_CONFIG_HINT = "point --model-dir at the checkpoint folder that holds the model's config.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
# config.json keys copied as they are into ModelDims
_ARCH_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "index_head_dim",
    "index_topk_freq",
    "index_skip_topk_offset",
    "compress_ratios",
    "sliding_window",
    "num_nextn_predict_layers",
    "max_position_embeddings",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "kv_source_layer_ids",
    "index_source_layer_ids",
    # the shape the resident-weight estimate counts (resident.py)
    "hidden_size",
    "vocab_size",
    "intermediate_size",
    "moe_intermediate_size",
    "n_routed_experts",
    "num_experts_per_tok",
    "n_shared_experts",
    "first_k_dense_replace",
    "q_lora_rank",
    "qk_nope_head_dim",
    "v_head_dim",
    "index_n_heads",
)
# Other names for the same fields (Qwen3.8-Flash-Next's indexer and MTP, GLM-5.3's key pool,
# Kimi-Linear's context)
_ALIASES = {
    "indexer_head_dim": "index_head_dim",
    "indexer_compress_ratio": "index_compress_ratio",
    "index_kpool": "index_compress_ratio",
    "mtp_num_hidden_layers": "num_nextn_predict_layers",
    "model_max_length": "max_position_embeddings",  # Kimi-Linear
    "num_experts": "n_routed_experts",  # Qwen3-Next, Kimi-Linear
    "num_experts_per_token": "num_experts_per_tok",  # Kimi-Linear
    "num_shared_experts": "n_shared_experts",  # Kimi-Linear
    "indexer_n_heads": "index_n_heads",
}
_DTYPES = {"bfloat16", "float16", "float32"}


@dataclass(frozen=True)
class PlannerDims:
    dims: ModelDims
    source: str  # where the architecture came from, for the report
    weights_gib: float | None  # resident on all GPUs together
    weights_source: str
    indexer_full_layers: int | None  # DSA layers whose indexer computes its own top-k


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal checkpoints nest the language model's fields under text_config."""
    inner = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(inner, dict):
        return {**inner, **{k: v for k, v in config.items() if k not in inner}}
    return config


def _fp8_algo(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower().startswith("fp8")


def _quant_says_fp8_kv(config: dict[str, Any], model_dir: Path) -> bool:
    """An FP8 KV-cache algorithm in the checkpoint's quantization config (ModelOpt's
    hf_quant_config.json or config.json quantization_config) makes vLLM store KV in fp8."""
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        if _fp8_algo(quant.get("kv_cache_quant_algo")):
            return True
        scheme = quant.get("kv_cache_scheme")
        if (
            isinstance(scheme, dict)
            and scheme.get("type") == "float"
            and scheme.get("num_bits") == 8
        ):
            return True
    path = model_dir / "hf_quant_config.json"
    if path.is_file():
        try:
            data = read_json_capped(path, MAX_CONFIG_BYTES, "checkpoint config", _CONFIG_HINT)
        except SM120Error as exc:
            raise PlanError(exc.message, exc.hint) from None
        section = data.get("quantization") if isinstance(data, dict) else None
        if isinstance(section, dict) and _fp8_algo(section.get("kv_cache_quant_algo")):
            return True
    return False


def _dims_from_config(
    config: dict[str, Any], model_dir: Path, recipe_dims: ModelDims | None
) -> ModelDims:
    config = _text_config(config)
    origin = model_dir / "config.json"
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0:
        raise PlanError(f"{origin} has no positive num_hidden_layers", _CONFIG_HINT)
    data: dict[str, Any] = {k: config[k] for k in _ARCH_KEYS if config.get(k) is not None}
    for alias, key in _ALIASES.items():
        if config.get(alias) is not None and key not in data:
            data[key] = config[alias]
    data.update(_linear_fields(config, layers))
    data.update(_qwen_shared_expert(config, data))
    heads = data.get("num_attention_heads")
    hidden = config.get("hidden_size")
    if "head_dim" not in data and isinstance(heads, int) and isinstance(hidden, int) and heads:
        data["head_dim"] = hidden // heads  # the HF convention when head_dim is absent
    if "num_key_value_heads" not in data and isinstance(heads, int):
        data["num_key_value_heads"] = heads
    if "max_position_embeddings" not in data and recipe_dims is not None:
        data["max_position_embeddings"] = recipe_dims.max_position_embeddings
    dtype = config.get("torch_dtype") or config.get("dtype")
    data["dtype"] = dtype if dtype in _DTYPES else "bfloat16"
    data["kv_cache_fp8"] = _quant_says_fp8_kv(config, model_dir)
    if recipe_dims is not None:
        data["block_size"] = recipe_dims.block_size
        data["dsa_indexer_cache"] = recipe_dims.dsa_indexer_cache
    try:
        return ModelDims.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PlanError(f"{origin}: {where}: {first['msg']}", _CONFIG_HINT) from None


def _qwen_shared_expert(config: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """Qwen's MoE names one shared expert by its width (shared_expert_intermediate_size); as
    n_shared_experts it counts when that width is a multiple of the routed experts'."""
    shared, routed = (
        config.get("shared_expert_intermediate_size"),
        data.get("moe_intermediate_size"),
    )
    if "n_shared_experts" in data or not isinstance(shared, int) or not isinstance(routed, int):
        return {}
    return {"n_shared_experts": shared // routed} if routed and shared % routed == 0 else {}


def _linear_fields(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """The recurrent layers of a hybrid model: Gated DeltaNet (Qwen3-Next's layer_types or
    full_attention_interval) or KDA (Kimi-Linear's linear_attn_config)."""
    kda = config.get("linear_attn_config")
    types = config.get("layer_types")
    counted = (
        sum(1 for kind in types[:layers] if kind == "linear_attention")
        if isinstance(types, list)
        else None
    )
    fields: dict[str, Any] = {}
    if isinstance(kda, dict) and kda.get("num_heads"):
        kda_layers, full = kda.get("kda_layers"), kda.get("full_attn_layers")
        if counted is None and isinstance(kda_layers, list):
            counted = len(kda_layers)
        elif counted is None and isinstance(full, list):
            counted = layers - len(full)
        heads, dim = kda["num_heads"], kda.get("head_dim")
        fields = {
            "linear_attention": "kda",
            "linear_num_key_heads": heads,
            "linear_num_value_heads": heads,
            "linear_key_head_dim": dim,
            "linear_value_head_dim": dim,
            "linear_conv_kernel_dim": kda.get("short_conv_kernel_size", 4),
        }
    elif config.get("linear_num_value_heads") is not None:
        interval = config.get("full_attention_interval")
        if counted is None and isinstance(interval, int) and interval > 0:
            counted = layers - layers // interval
        fields = {"linear_attention": "gdn"}
        ssm = config.get("mamba_ssm_dtype")
        if ssm in _DTYPES:
            fields["mamba_ssm_dtype"] = ssm
    if fields and counted is not None:
        fields["linear_layers"] = counted
    return fields


def _indexer_full_layers(config: dict[str, Any]) -> int | None:
    """How many layers compute their own indexer top-k (None when the model has no DSA)."""
    if not any(
        config.get(k) is not None
        for k in ("index_topk_pattern", "indexer_types", "index_topk_freq")
    ):
        return None
    return derive_index_topk_pattern(config).full_layers


def _weights_on_disk(model_dir: Path) -> float | None:
    total = sum(
        p.stat().st_size
        for p in model_dir.iterdir()
        if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES)
    )
    return total / GIB if total else None


@cache
def _known_checkpoints() -> tuple[dict[str, Any], ...]:
    text = resources.files("sm120.data").joinpath("model_dims.yaml").read_text("utf-8")
    return tuple(load_yaml(text)["checkpoints"])


def known_dims(repo: str | None, architecture: str) -> ModelDims | None:
    """The planner dimensions sm120/data/model_dims.yaml holds for this checkpoint, if any."""
    for entry in _known_checkpoints():
        if repo in entry["repos"] and entry["architecture"] == architecture:
            return ModelDims.model_validate(entry["dims"])
    return None


def load_dims(
    recipe_dims: ModelDims | None,
    recipe_weights_gib: float | None,
    model_dir: str | None,
    repo: str | None = None,
    architecture: str = "",
) -> PlannerDims:
    """Dimensions from `model_dir`'s config.json when it has one, else from the recipe, else
    from the known checkpoints (sm120/data/model_dims.yaml) by repo and architecture."""
    known = known_dims(repo, architecture) if recipe_dims is None else None
    source = "recipe model.dims" if known is None else "sm120/data/model_dims.yaml"
    recipe_dims = recipe_dims or known
    directory = Path(model_dir) if model_dir else None
    config = read_config(directory) if directory is not None and directory.is_dir() else None
    if config is not None and directory is not None:
        dims = _dims_from_config(config, directory, recipe_dims)
        disk = _weights_on_disk(directory)
        weights, weights_source = (
            (disk, f"weight files in {directory}") if disk else (recipe_weights_gib, "recipe")
        )
        return PlannerDims(
            dims=dims,
            source=f"{directory}/config.json",
            weights_gib=weights,
            weights_source=weights_source,
            indexer_full_layers=_indexer_full_layers(_text_config(config)),
        )
    if recipe_dims is None:
        missing = (
            f"there is no {directory}/config.json"
            if directory
            else "no checkpoint folder (--model-dir) with a config.json was given"
        )
        raise PlanError(
            f"no model dimensions: the recipe has no model.dims and {missing}",
            "pass --model-dir with the checkpoint, or add model.dims to the recipe",
        )
    full = None
    if recipe_dims.index_topk_freq is not None:
        given = {k: v for k, v in recipe_dims.model_dump().items() if v is not None}
        full = derive_index_topk_pattern(given).full_layers
    return PlannerDims(
        dims=recipe_dims,
        source=source,
        weights_gib=recipe_weights_gib,
        weights_source="recipe",
        indexer_full_layers=full,
    )
