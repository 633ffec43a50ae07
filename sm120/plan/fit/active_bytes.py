"""The weight bytes one decoded token reads, counted from the checkpoint's config.

A token passes every layer's attention (and, on DSA models, the indexer of the layers that
compute their own top-k), the dense layers' MLP, the shared experts and the routed experts
the router picks, then the LM head; of the embedding table it reads one row. Each weight is
counted at the width the checkpoint stores it (`dims.quantized` says which weights carry the
quantization; the rest are in the activation dtype). Tensor-parallel ranks split most of
these; vLLM's DeepSeek-family MLA keeps the query/KV down-projections (fused_qkv_a_proj) and
the indexer whole on every rank, so each rank reads those in full.

Counted from the config this is what a token touches, whatever else is resident (the MTP
layer, replicated copies, engine buffers, layers a checkpoint keeps at higher precision whose
unpicked experts a token never reads). Block-scale bytes are in the per-parameter widths;
norms, biases and the router (under 0.1%) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from sm120.plan.fit.dims import PlannerDims

GATED_PROJECTIONS = 3  # gate, up and down
ACTIVATION_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Bytes per quantized parameter, block scales included: NVFP4 packs 4 bits with one FP8
# scale per 16 values, MXFP4 one E8M0 scale per 32 (DeepSeek's "fp4" experts are that format:
# e2m1 values, ue8m0 scales over blocks of 32); FP8 block scales (1 per 128x128) are under
# 0.03% and left out.
EXPERT_BYTES = {
    "nvfp4": 0.5 + 1 / 16,
    "mxfp4": 0.5 + 1 / 32,
    "fp4": 0.5 + 1 / 32,
    "fp8": 1.0,
    "bf16": 2.0,
    "bfloat16": 2.0,
    "fp16": 2.0,
}


@dataclass(frozen=True)
class ActiveBytes:
    total: float  # read per token, all ranks together
    replicated: float  # of which every rank reads its own whole copy
    draft_step: float  # one MTP draft step: one decoder layer plus the LM head

    def per_rank(self, tp: int) -> float:
        return (self.total - self.replicated) / tp + self.replicated


def mla_params(dims: PlannerDims) -> tuple[int, int] | None:
    """(attention parameters per layer, of which replicated) for MLA, or None."""
    d = dims.dims
    if not (
        d.hidden_size
        and d.num_attention_heads
        and d.kv_lora_rank
        and d.qk_rope_head_dim
        and d.qk_nope_head_dim
        and d.v_head_dim
    ):
        return None
    heads, hidden = d.num_attention_heads, d.hidden_size
    qk_head = d.qk_nope_head_dim + d.qk_rope_head_dim
    if d.q_lora_rank:
        q_down, q_up = hidden * d.q_lora_rank, d.q_lora_rank * heads * qk_head
    else:
        q_down, q_up = 0, hidden * heads * qk_head
    kv_down = hidden * (d.kv_lora_rank + d.qk_rope_head_dim)
    kv_up = d.kv_lora_rank * heads * (d.qk_nope_head_dim + d.v_head_dim)
    out = heads * d.v_head_dim * hidden
    return q_down + q_up + kv_down + kv_up + out, q_down + kv_down


def indexer_params(dims: PlannerDims) -> int:
    d = dims.dims
    if not (d.index_n_heads and d.index_head_dim and d.q_lora_rank and d.hidden_size):
        return 0
    query = d.q_lora_rank * d.index_n_heads * d.index_head_dim
    key = d.hidden_size * d.index_head_dim
    weights = d.hidden_size * d.index_n_heads
    return query + key + weights


def active_weight_bytes(dims: PlannerDims, expert_bytes: float) -> ActiveBytes | None:
    """The bytes a token reads, or None when the dims lack the attention and MLP shape
    (the roofline then falls back to the resident size)."""
    d = dims.dims
    mla = mla_params(dims)
    if (
        mla is None
        or not d.vocab_size
        or not d.moe_intermediate_size
        or not d.num_experts_per_tok
        or (d.first_k_dense_replace and not d.intermediate_size)
    ):
        return None
    hidden = d.hidden_size or 0
    activation = ACTIVATION_BYTES[d.dtype]
    attention_width = expert_bytes if d.quantized == "all_linear" else activation
    dense_width = expert_bytes if d.quantized == "all_linear" else activation
    attention, attention_replicated = mla
    indexer = indexer_params(dims)
    indexer_layers = dims.indexer_full_layers or d.num_hidden_layers
    expert = GATED_PROJECTIONS * hidden * d.moe_intermediate_size
    per_token_experts = (d.num_experts_per_tok + d.n_shared_experts) * expert
    moe_layers = d.num_hidden_layers - d.first_k_dense_replace
    dense = d.first_k_dense_replace * GATED_PROJECTIONS * hidden * (d.intermediate_size or 0)
    lm_head = d.vocab_size * hidden * activation
    attention_bytes = d.num_hidden_layers * attention * attention_width
    indexer_bytes = indexer_layers * indexer * activation
    total = (
        attention_bytes
        + indexer_bytes
        + dense * dense_width
        + moe_layers * per_token_experts * expert_bytes
        + lm_head
    )
    replicated = d.num_hidden_layers * attention_replicated * attention_width + indexer_bytes
    draft_layer = attention * attention_width + per_token_experts * expert_bytes
    return ActiveBytes(total=total, replicated=replicated, draft_step=draft_layer + lm_head)
