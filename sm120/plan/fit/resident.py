"""Resident weights estimated from the model's dimensions, for a plan that has no measured
size: the recipe states no model.weights_gib and no checkpoint is on disk (--model-dir).

The count is the checkpoint's linear layers from its config (model.dims): the embedding table
and the LM head, every layer's attention (full, MLA with its indexer, DeepSeek-V4's low-rank
query and grouped output, or a hybrid's Gated DeltaNet / KDA projections), the dense layers'
MLP, the routed and shared experts, and the MTP layers when the plan runs them (vLLM loads
them only then). Widths follow active_bytes.py: experts at the quantization's width with its
block scales, the rest in the activation dtype unless model.dims.quantized says every linear
layer is quantized. Per GPU, tensor parallelism splits everything but what vLLM's
DeepSeek-family MLA keeps whole on each rank (the query/KV down-projections and the indexer).

Left out, each under 1% of a MoE checkpoint: norms, biases, routers, convolution and gate
vectors, DeepSeek-V4's KV compressors and hyper-connection mixers. A part whose shape model.dims
does not give is named in `not_counted` rather than guessed. DeepSeek-V4.1's Engram tables
are not GPU weights: the recipe's engram-config keeps them in host RAM or on disk.
tests/plan/test_resident_estimate.py checks the count against the recipes' measured sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sm120.plan.fit.active_bytes import (
    ACTIVATION_BYTES,
    EXPERT_BYTES,
    GATED_PROJECTIONS,
    indexer_params,
    mla_params,
)
from sm120.plan.fit.dims import GIB, PlannerDims

SOURCE = "estimated from config dims; pass --model-dir or --kv-memory-gib for a measured figure"
# DeepSeek-V4's output projection is a grouped low-rank pair; V4-Flash's and V4.1-Flash's
# configs both give o_groups 8 and o_lora_rank 1024 (model.dims has no field for them).
DSV4_O_GROUPS = 8
DSV4_O_LORA_RANK = 1024
DSV4_FAMILY = ("dsv4_compressed", "dsv41_ced")
MLA_FAMILY = ("mla", "mla_sparse_dsa", "kda_mla_hybrid", "kda_dsa_hybrid")
WITH_INDEXER = ("mla_sparse_dsa", "kda_dsa_hybrid")


@dataclass(frozen=True)
class WeightEstimate:
    """One copy of every resident weight, in bytes, and what the count had to leave out."""

    total_bytes: float
    replicated_bytes: float  # of which every tensor-parallel rank keeps its own whole copy
    params: int
    not_counted: tuple[str, ...]

    def per_gpu_gib(self, tp: int) -> float:
        return ((self.total_bytes - self.replicated_bytes) / tp + self.replicated_bytes) / GIB

    def as_dict(self) -> dict[str, object]:
        return {
            "params_billion": round(self.params / 1e9, 2),
            "total_gib": round(self.total_bytes / GIB, 2),
            "not_counted": list(self.not_counted),
        }


@dataclass
class _Count:
    bytes: float = 0.0
    replicated: float = 0.0
    params: int = 0

    def add(self, params: int, width: float, replicated: bool = False) -> None:
        self.params += params
        self.bytes += params * width
        if replicated:
            self.replicated += params * width


def estimate_gap(dims: PlannerDims, quantization: str) -> str | None:
    """Why there can be no estimate (one clause), or None when there can be one."""
    d = dims.dims
    if quantization.lower() not in EXPERT_BYTES:
        return f"quantization '{quantization}' has no bytes-per-parameter figure to estimate it"
    lacking = [name for name in ("hidden_size", "vocab_size") if not getattr(d, name)]
    if not (d.n_routed_experts and d.moe_intermediate_size) and not d.intermediate_size:
        lacking.append("intermediate_size or n_routed_experts and moe_intermediate_size")
    if lacking:
        return f"model.dims lacks {', '.join(lacking)} to estimate it"
    return None


def estimate_weights(
    dims: PlannerDims, attention: str, quantization: str, draft_layers: int
) -> WeightEstimate | None:
    """The estimate, or None when estimate_gap names what is missing (the plan then asks for
    a measured size)."""
    if estimate_gap(dims, quantization) is not None:
        return None
    d = dims.dims
    expert_width = EXPERT_BYTES[quantization.lower()]
    hidden, vocab = d.hidden_size or 0, d.vocab_size or 0
    activation = ACTIVATION_BYTES[d.dtype]
    linear = expert_width if d.quantized == "all_linear" else activation
    count, missing = _Count(), []
    count.add(2 * vocab * hidden, activation)  # embedding table and (untied) LM head
    layers = d.num_hidden_layers + draft_layers
    attention_layers, linear_layers = layers, 0
    if d.linear_layers is not None and d.linear_attention is not None:
        linear_layers = d.linear_layers
        attention_layers = layers - linear_layers
        recurrent = _recurrent_params(dims)
        if recurrent is None:
            missing.append("the recurrent layers (linear_* fields)")
        else:
            count.add(linear_layers * recurrent, linear)
    shape = _attention_params(dims, attention)
    if shape is None:
        missing.append(f"the attention layers ({attention}: model.dims lacks their shape)")
    else:
        params, replicated = shape
        count.add(attention_layers * (params - replicated), linear)
        count.add(attention_layers * replicated, linear, replicated=True)
    if attention in WITH_INDEXER:
        indexer = indexer_params(dims)
        if indexer:
            every = (dims.indexer_full_layers or d.num_hidden_layers) + draft_layers
            count.add(min(every, attention_layers) * indexer, activation, replicated=True)
        else:
            missing.append("the sparse-attention indexer (index_n_heads, q_lora_rank)")
    _add_mlp(count, dims, layers, linear, expert_width, missing)
    return WeightEstimate(count.bytes, count.replicated, count.params, tuple(missing))


def _add_mlp(
    count: _Count,
    dims: PlannerDims,
    layers: int,
    linear: float,
    expert_width: float,
    missing: list[str],
) -> None:
    d = dims.dims
    hidden = d.hidden_size or 0
    if not (d.n_routed_experts and d.moe_intermediate_size):
        count.add(layers * GATED_PROJECTIONS * hidden * (d.intermediate_size or 0), linear)
        return
    dense = d.first_k_dense_replace
    if dense and d.intermediate_size:
        count.add(dense * GATED_PROJECTIONS * hidden * d.intermediate_size, linear)
    elif dense:
        missing.append(f"the {dense} dense layers' MLP (intermediate_size)")
    expert = GATED_PROJECTIONS * hidden * d.moe_intermediate_size
    count.add((layers - dense) * (d.n_routed_experts + d.n_shared_experts) * expert, expert_width)


def _attention_params(dims: PlannerDims, attention: str) -> tuple[int, int] | None:
    """(parameters of one attention layer, of which each TP rank keeps whole), or None."""
    d = dims.dims
    if attention in MLA_FAMILY:
        return mla_params(dims)
    hidden, heads, head_dim = d.hidden_size, d.num_attention_heads, d.head_dim
    if not (hidden and heads and head_dim):
        return None
    if attention in DSV4_FAMILY:
        if not d.q_lora_rank:
            return None
        query = hidden * d.q_lora_rank + d.q_lora_rank * heads * head_dim
        kv = hidden * head_dim  # one shared latent KV head
        groups = DSV4_O_GROUPS * DSV4_O_LORA_RANK
        output = heads * head_dim * DSV4_O_LORA_RANK + groups * hidden
        return query + kv + output, 0
    kv_heads = d.num_key_value_heads or heads
    # Qwen3-Next's attention layers gate their output: q_proj yields a gate per head too
    query = heads * head_dim * (2 if attention == "gdn_hybrid" else 1)
    return hidden * (query + 2 * kv_heads * head_dim) + heads * head_dim * hidden, 0


def _recurrent_params(dims: PlannerDims) -> int | None:
    """One Gated DeltaNet or KDA layer's projections (vLLM's qwen3_next.py, kimi_linear.py)."""
    d = dims.dims
    hidden = d.hidden_size or 0
    key_heads, value_heads = d.linear_num_key_heads, d.linear_num_value_heads
    key_dim, value_dim = d.linear_key_head_dim, d.linear_value_head_dim
    if not (key_heads and value_heads and key_dim and value_dim):
        return None
    keys, values = key_heads * key_dim, value_heads * value_dim
    if d.linear_attention == "gdn":
        # in_proj_qkvz (q, k, v, z), in_proj_ba (b, a per value head), out_proj
        return hidden * (2 * keys + 2 * values) + hidden * 2 * value_heads + values * hidden
    # KDA: q, k, v and o; low-rank decay (f_a, f_b) and output gate (g_a, g_b); beta
    low_rank = 2 * (hidden * value_dim + value_dim * values)
    return hidden * (2 * keys + values) + values * hidden + low_rank + hidden * value_heads
