"""Hybrid linear-attention models as vLLM 0.26's hybrid allocator lays them out.

Recurrent layers (Gated DeltaNet, Kimi Delta Attention) keep a fixed state per sequence -- a
short causal-conv window and a head_v x head_k recurrent matrix per head -- beside the
attention layers' per-token KV. vLLM 0.26.0 (read in its wheel):

- state shapes, vllm/model_executor/layers/mamba/mamba_utils.py: GDN conv (3 + spec tokens,
  (2 x key heads x key dim + value heads x value dim) / TP), recurrent (value heads / TP,
  value dim, key dim), both in the model dtype unless --mamba-ssm-cache-dtype (or the
  config's mamba_ssm_dtype) says otherwise; KDA conv (kernel - 1, 3 x heads x dim / TP) in
  the model dtype, recurrent (heads / TP, dim, dim) always fp32.
- one page size for all, platforms/interface.py _align_hybrid_block_size: the attention block
  grows to kernel_align x cdiv(state, kernel_align x attention bytes per token), kernel_align
  being max(the backend's smallest kernel block, --block-size); the state page is padded to
  the attention page.
- groups, v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size: layers of one
  spec are cut into groups of group_size layers (the smaller type's count, or the larger's
  when it is under 1.5x the smaller), each group with its own block table; the pool is
  num_blocks = memory // page // group_size.
- a request's blocks, kv_cache_interface.py: each attention group cdiv(len / DCP, block),
  each state group 1 + spec (no prefix caching), 2 + spec (mamba_cache_mode align), so the
  reported figure is int(num_blocks / blocks(max_model_len) x max_model_len) as for the rest.
  Prefix caching is off by default for hybrid models; on, with mamba_cache_mode none, it
  becomes align (Qwen3-Next and Kimi-Linear do not support 'all', so 'all' falls back too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from sm120.core.errors import PlanError
from sm120.plan.fit.kv import KVLayout, cdiv
from sm120.recipe.schema import ModelDims

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 0}
# The smallest kernel block of vLLM 0.26's attention backends on Hopper/Blackwell: FlashAttention
# takes multiples of 16; FlashMLA pages are 64 tokens (vllm/v1/attention/backends).
T = TypeVar("T")
KERNEL_BLOCK = {"full": 16, "mla": 64}
MAMBA_MODES = ("none", "align", "all")


@dataclass(frozen=True)
class HybridShape:
    """What the hybrid allocator needs of a model, per rank."""

    attention_layers: int  # per-token KV layers, MTP ones included
    token_bytes: int  # one token of one attention layer on one rank
    linear_layers: int
    state_bytes: int  # one sequence's recurrent + conv state of one layer on one rank
    kernel_block: int
    summary: str  # how an attention token is stored, in words


def state_bytes(dims: ModelDims, tp: int, spec_tokens: int, ssm_dtype: str | None) -> int:
    """One recurrent layer's state on one rank (vLLM 0.26 mamba_utils.py)."""
    kind = _need(dims.linear_attention, "linear_attention")
    conv_bytes = _DTYPE_BYTES[dims.dtype]
    key_heads = _need(dims.linear_num_key_heads, "linear_num_key_heads")
    value_heads = _need(dims.linear_num_value_heads, "linear_num_value_heads")
    key_dim = _need(dims.linear_key_head_dim, "linear_key_head_dim")
    value_dim = _need(dims.linear_value_head_dim, "linear_value_head_dim")
    kernel = _need(dims.linear_conv_kernel_dim, "linear_conv_kernel_dim")
    conv_dim = 2 * key_heads * key_dim + value_heads * value_dim
    if kind == "kda":
        # KDA: conv window of kernel - 1 (no room for draft tokens), fp32 recurrent state
        conv = _shard(conv_dim, tp) * (kernel - 1) * conv_bytes
        recurrent = _shard(value_heads, tp) * value_dim * value_dim * 4
        return conv + recurrent
    if ssm_dtype is not None and ssm_dtype not in _DTYPE_BYTES:
        raise PlanError(
            f"mamba-ssm-cache-dtype '{ssm_dtype}' is not one the planner models",
            "use auto, bfloat16, float16 or float32",
        )
    ssm = _DTYPE_BYTES[ssm_dtype or "auto"] or (
        _DTYPE_BYTES[dims.mamba_ssm_dtype] if dims.mamba_ssm_dtype else conv_bytes
    )
    conv = _shard(conv_dim, tp) * (kernel - 1 + spec_tokens) * conv_bytes
    recurrent = _shard(value_heads, tp) * value_dim * key_dim * ssm
    return conv + recurrent


def mamba_mode(prefix_caching: bool, requested: str | None) -> str:
    """The mamba_cache_mode vLLM 0.26 runs with (MambaModelConfig.verify_and_update_config)."""
    if requested is not None and requested not in MAMBA_MODES:
        raise PlanError(
            f"mamba-cache-mode '{requested}' is not one vLLM knows",
            "use none, align or all",
        )
    if not prefix_caching:
        return "none"
    # neither Qwen3-Next nor Kimi-Linear supports 'all': vLLM falls back to 'align'
    return "align"


def hybrid(shape: HybridShape, block_size: int, mode: str, spec_tokens: int, dcp: int) -> KVLayout:
    """The pool of one rank: one page size, attention and state groups of equal size."""
    if shape.linear_layers == 0 or shape.attention_layers == 0:
        raise PlanError(
            "a hybrid layout needs both recurrent and attention layers",
            "check model.dims.linear_layers against num_hidden_layers",
        )
    align = max(shape.kernel_block, block_size)
    needed = align * cdiv(shape.state_bytes, align * shape.token_bytes)
    block = max(block_size, needed)
    page = block * shape.token_bytes
    smaller = min(shape.attention_layers, shape.linear_layers)
    larger = max(shape.attention_layers, shape.linear_layers)
    group_size = larger if larger < smaller * 1.5 else smaller
    attention_groups = cdiv(shape.attention_layers, group_size)
    state_groups = cdiv(shape.linear_layers, group_size)
    held = (2 if mode == "align" else 1) + spec_tokens
    grown = f", raised from {block_size} so a page holds a state" if block > block_size else ""
    summary = (
        f"{shape.attention_layers} attention layers ({shape.summary}) + {shape.linear_layers} "
        f"recurrent layers ({shape.state_bytes:,} B of state each, padded to the "
        f"{page:,} B page); {block}-token blocks{grown}; groups of {group_size} layers: "
        f"{attention_groups} attention, {state_groups} state, each state group holding "
        f"{held} page(s) per request (mamba_cache_mode {mode})"
    )
    return KVLayout(
        summary=summary,
        block_size=block,
        bytes_per_block=page * group_size,
        dcp=dcp,
        token_tables=attention_groups,
        state_blocks=state_groups * held,
    )


def _shard(value: int, tp: int) -> int:
    """Heads or channels of one rank. vLLM 0.26 asserts TP divides them; an engine that runs a
    TP that does not (Kimi-K3's 96 KDA heads at TP 9) pads them, so a rank holds the ceiling."""
    return cdiv(value, tp)


def _need(value: T | None, field: str) -> T:
    if value is None:
        raise PlanError(
            f"model.dims has no {field}, which a hybrid linear-attention layout needs",
            "pass --model-dir with the checkpoint's config.json, or add it to model.dims",
        )
    return value
