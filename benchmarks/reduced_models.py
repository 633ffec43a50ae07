"""Reduced-layer configs of the recipes' architectures, for the planner's check on a real GPU.

The KV cache an engine allocates depends on the attention and KV dimensions, the number of
layers of each kind and the engine's own rules (block size, page padding, which layers own
an indexer or a sliding-window cache) -- not on the hidden size, the experts or the vocabulary.
So each config keeps every field the KV depends on at the real checkpoint's value (sources:
shared/reference/vllm_facts.md section 2.2, the recipes' `model.dims`), keeps the layer
*pattern* (dense/MoE, indexer/skip, compressed ratio 4/128/window-only) while cutting its
length, and shrinks the rest so that `--load-format dummy` fills it in seconds.

Written for the engine to read (`vllm serve DIR --load-format dummy --skip-tokenizer-init`)
and for `sm120 plan --model-dir DIR`, which reads the same config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# GLM-4.7 (Glm4MoeForCausalLM): GQA, 8 KV heads of 128, every layer full attention.
GLM47: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "num_hidden_layers": 4,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "partial_rotary_factor": 0.5,
    "use_qk_norm": True,
    "attention_bias": True,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 202752,
    "rope_theta": 1000000,
    # shrunk: none of these reach the KV cache
    "hidden_size": 2048,
    "intermediate_size": 4096,
    "moe_intermediate_size": 512,
    "first_k_dense_replace": 1,
    "n_routed_experts": 16,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "vocab_size": 151552,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# GLM-5.2 (GlmMoeDsaForCausalLM): MLA (one 512 + 64 latent per token and layer) with a DSA
# indexer; upstream vLLM builds the indexer only where the layer computes its own top-k
# (index_topk_freq 4 from offset 3: of 8 layers, 0, 1, 2 and 6).
GLM52: dict[str, Any] = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "num_hidden_layers": 8,
    "num_attention_heads": 64,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 192,
    "v_head_dim": 256,
    "q_lora_rank": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "index_topk": 2048,
    "index_topk_freq": 4,
    "index_skip_topk_offset": 3,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 1048576,
    # shrunk
    "hidden_size": 2048,
    "intermediate_size": 4096,
    "moe_intermediate_size": 512,
    "first_k_dense_replace": 1,
    "n_routed_experts": 16,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "vocab_size": 154880,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# DeepSeek-V4-Flash (DeepseekV4ForCausalLM): one 512-wide latent (448 fp8 NoPE + 64 RoPE),
# compressed 4x (with an indexer) or 128x, a 128-token sliding window on every layer, the
# first two layers window-only. Cut from 43 to 8 layers with the same pattern, and the MTP
# layer's ratio (0) last, as in the real compress_ratios.
DSV4: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "num_hidden_layers": 8,
    "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 0],
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1024,
    "o_lora_rank": 1024,
    "o_groups": 8,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "sliding_window": 128,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 16,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "num_hash_layers": 3,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "swiglu_limit": 10.0,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    # shrunk
    "hidden_size": 2048,
    "moe_intermediate_size": 512,
    "n_routed_experts": 16,
    "num_experts_per_tok": 6,
    "n_shared_experts": 1,
    "vocab_size": 129280,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    # vLLM's DeepSeek-V4 attention always runs its output projection as a DeepGEMM fp8
    # einsum, which reads the block scales of an fp8 checkpoint: the FP8 checkpoint's
    # quantization (128x128 blocks) is part of what makes the model start. fp8 experts (the
    # Flash-Base form) rather than MXFP4 ones: the experts do not touch the KV cache.
    "quantization_config": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [128, 128],
    },
    "expert_dtype": "fp8",
}

# Qwen3-Next-80B-A3B (Qwen3NextForCausalLM): Gated DeltaNet layers (16 key heads and 32 value
# heads of 128, conv kernel 4) with a full GQA layer every 4th (2 KV heads of 256). Cut from
# 48 to 8 layers, the 3 x linear + 1 x full pattern kept (config copy:
# tests/data/model_configs/qwen3-next-80b-a3b.json).
QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "num_hidden_layers": 8,
    "layer_types": ["linear_attention"] * 3
    + ["full_attention"]
    + ["linear_attention"] * 3
    + ["full_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "partial_rotary_factor": 0.25,
    "rope_theta": 10000000,
    "max_position_embeddings": 262144,
    "num_nextn_predict_layers": 1,
    # shrunk
    "hidden_size": 2048,
    "intermediate_size": 4096,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# Kimi-Linear-48B-A3B (KimiLinearForCausalLM): KDA layers (32 heads of 128, conv kernel 4) with
# an MLA layer (512 + 64 latent) every 4th; Kimi-K3 (KimiK3ForConditionalGeneration) has the
# same two layer kinds (96 KDA heads, 69 KDA + 24 MLA layers) and no vLLM 0.26 registry entry.
# Cut from 27 to 8 layers (config copy: tests/data/model_configs/kimi-linear-48b-a3b.json).
KIMI_LINEAR: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "num_hidden_layers": 8,
    "linear_attn_config": {
        "kda_layers": [1, 2, 3, 5, 6, 7],
        "full_attn_layers": [4, 8],
        "num_heads": 32,
        "head_dim": 128,
        "short_conv_kernel_size": 4,
    },
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 72,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": True,
    "model_max_length": 1048576,
    "max_position_embeddings": 1048576,
    "num_nextn_predict_layers": 0,
    # shrunk
    "hidden_size": 2304,
    "intermediate_size": 4096,
    "moe_intermediate_size": 512,
    "num_experts": 16,
    "num_experts_per_token": 4,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "routed_scaling_factor": 2.446,
    "use_grouped_topk": True,
    "num_expert_group": 1,
    "topk_group": 1,
    "vocab_size": 163840,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

CONFIGS: dict[str, dict[str, Any]] = {
    "glm47": GLM47,
    "glm52": GLM52,
    "dsv4": DSV4,
    "qwen3next": QWEN3_NEXT,
    "kimilinear": KIMI_LINEAR,
}


def write_reduced(recipe: str, dest: Path) -> Path:
    """Write the reduced config of `recipe`'s architecture into dest/config.json."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(CONFIGS[recipe], indent=2) + "\n")
    return dest
