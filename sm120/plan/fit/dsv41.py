"""DeepSeek-V4.1's KV cache: compressed KV on a few source layers, read by all the others.

DeepSeek-V4.1-Flash's config.json (copy: tests/data/model_configs/deepseek-v4.1-flash.json)
keeps DeepSeek-V4's per-layer compress_ratios (here 2 and 1, and 0 for the two first and the
MTP layers) and adds cross-layer sharing: only the kv_source_layer_ids [2, 8, 14, 20] store
their compressed latent, only the index_source_layer_ids [2, 8, ..., 36] store indexer keys,
and every layer keeps its own sliding-window ring (the "20 + 20" encoder-decoder: layers
21-39 read layer 20's cache). The layout below is that arithmetic with DeepSeek-V4's stored
formats -- 584 B per stored latent token (fp8 NoPE + bf16 RoPE + scales), 132 B per indexer key
(fp8 + one fp32 scale per 128) -- in blocks of --block-size tokens, the windows in blocks of
--swa-block-size. The recipe's Karmic Kraken engine stores the latent as NVFP4 and the
windows as MXFP8 (rtx6kpro models/deepseek-v4.1-flash.md: "MXFP8 sliding-window payloads,
NVFP4 indexed payloads"), whose exact byte layout is in no stored source: this plan counts
fp8 records, so it is conservative for that engine (more bytes per token than NVFP4), and the
compressor states (a few kB per request) are left out. No vLLM release has the architecture
(0.26.0's registry maps DeepseekV4ForCausalLM only), so there is no GPU proof of it here.
"""

from __future__ import annotations

from sm120.core.errors import PlanError
from sm120.plan.fit.kv import (
    DSV4_STATE_BYTES,
    KVDtype,
    KVLayout,
    WindowCache,
    _need,
)
from sm120.recipe.schema import ModelDims

DEFAULT_SWA_BLOCK = 128  # the recipe's --swa-block-size


def deepseek_v41(
    dims: ModelDims,
    dcp: int,
    dtype: KVDtype,
    block_size: int,
    extra_layers: int,
    chunk: int,
    swa_block: int = DEFAULT_SWA_BLOCK,
) -> KVLayout:
    if not dtype.fp8:
        raise PlanError(
            f"DeepSeek-V4.1 needs an fp8 KV cache, got {dtype.name} (F14)",
            "set kv-cache-dtype fp8",
        )
    ratios = dims.compress_ratios or ()
    sources = dims.kv_source_layer_ids or ()
    index_sources = dims.index_source_layer_ids or ()
    if not ratios or not sources:
        _need(None, "compress_ratios and kv_source_layer_ids")
    index_dim = _need(dims.index_head_dim, "index_head_dim")
    index_bytes = index_dim + index_dim // 128 * 4
    latent = sum(_stored(block_size, ratios, layer) for layer in sources) * DSV4_STATE_BYTES
    keys = sum(_stored(block_size, ratios, layer) for layer in index_sources) * index_bytes
    layers = dims.num_hidden_layers + extra_layers
    window = WindowCache(
        "sliding window",
        layers,
        _need(dims.sliding_window, "sliding_window"),
        swa_block,
        page_bytes=swa_block * DSV4_STATE_BYTES,
    )
    return KVLayout(
        summary=f"{len(sources)} KV source layers x {DSV4_STATE_BYTES} B per stored token "
        f"and {len(index_sources)} index source layers x {index_bytes} B per stored key, "
        f"compressed by their ratios ({latent + keys:,} B per {block_size}-token block); "
        f"{layers} sliding-window rings of {window.window} tokens in {swa_block}-token pages "
        "(fp8 records: the engine's NVFP4/MXFP8 payloads are smaller)",
        block_size=block_size,
        bytes_per_block=latent + keys,
        dcp=dcp,
        windows=(window,),
        chunk_tokens=chunk,
    )


def _stored(block_size: int, ratios: tuple[int, ...], layer: int) -> int:
    """Tokens of a block a layer stores: block / ratio (ratio 0 or 1: every token)."""
    if not 0 <= layer < len(ratios):
        raise PlanError(
            f"a DeepSeek-V4.1 source layer {layer} has no compress_ratios entry",
            "check kv_source_layer_ids / index_source_layer_ids against compress_ratios",
        )
    ratio = max(ratios[layer], 1)
    return block_size // ratio
