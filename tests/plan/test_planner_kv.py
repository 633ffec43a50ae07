"""The KV formulas per attention family, against vllm_facts.md §2 and vLLM's own rules."""

from __future__ import annotations

import pytest

from sm120.core.errors import PlanError
from sm120.plan.fit import kv
from sm120.recipe.schema import ModelDims
from tests.helpers import BF16, DSV4, FP8

GIB = 1024**3

GLM47 = ModelDims(
    num_hidden_layers=92,
    num_attention_heads=96,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=202752,
)
GLM52 = ModelDims(
    num_hidden_layers=78,
    num_attention_heads=64,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    index_head_dim=128,
    index_topk_freq=4,
    index_skip_topk_offset=3,
    num_nextn_predict_layers=1,
    max_position_embeddings=1048576,
)


def per_token(layout: kv.KVLayout) -> float:
    return layout.bytes_per_block / layout.block_size


def test_full_attention_shards_kv_heads_over_tp() -> None:
    # 2 x 8 heads x 128 x 2 B x 92 layers = 376,832 B in bf16 over all ranks (vllm_facts 2.2)
    assert per_token(kv.full_attention(GLM47, 1, 1, BF16, 16, 0)) == 376_832
    assert per_token(kv.full_attention(GLM47, 4, 1, BF16, 16, 0)) == 94_208
    assert per_token(kv.full_attention(GLM47, 4, 1, FP8, 16, 0)) == 47_104
    # an MTP layer keeps its own KV
    assert per_token(kv.full_attention(GLM47, 4, 1, FP8, 16, 1)) == 47_104 * 93 // 92


def test_full_attention_copies_heads_beyond_their_count_and_only_copies_allow_dcp() -> None:
    sixteen = kv.full_attention(GLM47, 16, 2, FP8, 16, 0)
    assert per_token(sixteen) == 92 * 2 * 1 * 128  # one head per rank, two copies of each
    assert sixteen.blocks_per_request(1600) == 50  # DCP 2 halves the tokens each rank keeps
    with pytest.raises(PlanError) as caught:
        kv.full_attention(GLM47, 4, 2, FP8, 16, 0)
    assert caught.value.one_line() == (
        "decode-context-parallel-size 2 needs duplicated KV heads, but TP 4 over 8 KV heads "
        "leaves 1 copy per head (hint: use decode-context-parallel-size 1: the KV heads are "
        "already sharded)"
    )


def test_full_attention_rejects_a_tp_the_kv_heads_cannot_split() -> None:
    with pytest.raises(PlanError, match="tensor-parallel-size 3 does not fit the model's 8 KV"):
        kv.full_attention(GLM47, 3, 1, FP8, 16, 0)


def test_sparse_mla_on_the_b12x_engine_is_656_plus_132_on_every_layer() -> None:
    # 79 x (656 + 132) = 62,252 B/token per rank (vllm_facts 2.2, the recipe's README)
    layout = kv.mla(GLM52, 4, 1, FP8, 64, 1, indexer_layers=79)
    assert per_token(layout) == 62_252


def test_sparse_mla_upstream_has_indexers_on_full_layers_only() -> None:
    # 78 x 656 + 21 x 132 + (656 + 132) for MTP = 54,728 B (vllm_facts 2.2, upstream)
    assert per_token(kv.mla(GLM52, 4, 1, FP8, 64, 1, indexer_layers=21 + 1)) == 54_728


def test_mla_without_sparse_attention_stores_the_latent() -> None:
    assert per_token(kv.mla(GLM52, 4, 1, BF16, 16, 0)) == 78 * 576 * 2
    assert per_token(kv.mla(GLM52, 4, 1, FP8, 16, 0)) == 78 * 576


def test_mla_is_the_same_on_every_tp_rank_and_dcp_shards_the_tokens() -> None:
    tp1 = kv.mla(GLM52, 1, 1, FP8, 64, 1, indexer_layers=79)
    tp4 = kv.mla(GLM52, 4, 1, FP8, 64, 1, indexer_layers=79)
    dcp4 = kv.mla(GLM52, 4, 4, FP8, 64, 1, indexer_layers=79)
    assert tp1.bytes_per_block == tp4.bytes_per_block == dcp4.bytes_per_block
    assert dcp4.blocks_per_request(250_000) == 977  # cdiv(cdiv(250000, 4), 64)
    assert tp4.blocks_per_request(250_000) == 3907


def test_approximate_gcd_pads_the_fewest_layers() -> None:
    # DeepSeek-V4-Flash: 21 C4 tuples, 44 sliding-window caches, 21 / 20 compressor states
    assert kv.approximate_gcd([21, 44, 21, 20], lower_bound=21) == 22
    assert kv.approximate_gcd([6, 12], lower_bound=3) == 6  # ties go to the larger divisor


def test_deepseek_v4_packs_576_aligned_pages_in_22_layer_tuples() -> None:
    layout = kv.deepseek_v4(DSV4, 1, FP8, 256, extra_layers=1, chunk=4096)
    # C4 latent 64 x 584 -> 37,440; C4 indexer 64 x 132 -> 8,640; C128 latent 2 x 584 -> 1,728
    assert layout.bytes_per_block == (37_440 + 8_640 + 1_728) * 22
    names = [(w.name, w.tables, w.window, w.block_size) for w in layout.windows]
    assert names == [
        ("sliding window", 2, 128, 64),
        ("C4 compressor state", 1, 8, 4),
        ("C128 compressor state", 1, 128, 8),
    ]
    # 4096 compressed blocks + 2 x 67 sliding-window + 1027 C4 state + 529 C128 state
    assert layout.blocks_per_request(1_048_576) == 4096 + 134 + 1027 + 529


def test_deepseek_v4_window_caches_cost_more_per_token_at_short_context() -> None:
    layout = kv.deepseek_v4(DSV4, 1, FP8, 256, extra_layers=1, chunk=4096)
    assert layout.bytes_per_token(1_048_576) < layout.bytes_per_token(131_072)


@pytest.mark.parametrize(
    ("dcp", "dtype", "block", "message"),
    [
        (2, FP8, 256, "DeepSeek-V4 cannot use decode-context-parallel-size > 1"),
        (1, BF16, 256, "DeepSeek-V4 needs an fp8 KV cache, got bfloat16 (F14)"),
        (1, FP8, 64, "DeepSeek-V4 needs a block size that is a multiple of 128, got 64"),
    ],
)
def test_deepseek_v4_rejects_what_the_engine_rejects(
    dcp: int, dtype: kv.KVDtype, block: int, message: str
) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        kv.deepseek_v4(DSV4, dcp, dtype, block, extra_layers=1, chunk=4096)


def test_pool_reports_like_the_engine_and_finds_the_longest_context() -> None:
    layout = kv.KVLayout("test", block_size=128, bytes_per_block=128 * 1024)
    result = kv.pool(layout, 2 * GIB, context=1000, cap=4096)
    assert result.num_blocks == 16384
    assert result.tokens == 2_048_000  # int(16384 / cdiv(1000, 128) * 1000)
    assert result.concurrency == 2048.0
    assert result.max_context == 4096  # capped by the model
    assert kv.longest_context(layout, 3, cap=10_000) == 384
    assert kv.pool(layout, 1000, context=1000, cap=4096).max_context == 0


def test_kv_dtype_follows_the_checkpoint_when_auto() -> None:
    fp8_checkpoint = GLM47.model_copy(update={"kv_cache_fp8": True})
    assert kv.resolve_kv_dtype(None, fp8_checkpoint).fp8
    assert kv.resolve_kv_dtype("auto", GLM47).element_bytes == 2
    assert kv.resolve_kv_dtype("bfloat16", fp8_checkpoint).element_bytes == 2
    with pytest.raises(PlanError) as caught:
        kv.resolve_kv_dtype("int4", GLM47)
    assert caught.value.one_line() == (
        "kv-cache-dtype 'int4' is not one the planner models "
        "(hint: use auto, bfloat16, fp8 or fp8_e4m3)"
    )
