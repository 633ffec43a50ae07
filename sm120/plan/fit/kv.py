"""How the engine lays the KV cache out on one rank, per attention family.

Every layout is a pool of equal blocks; a request of `context` tokens takes
`blocks_per_request(context)` of them. The engine's "KV cache size: N tokens" line is
int(num_blocks / blocks_per_request(max_model_len) * max_model_len), which is what `pool`
returns. Formulas: shared/reference/vllm_facts.md §2 (vLLM's kv_cache_interface.py and the
DeepSeek-V4 model code), checked against the seeds and the real CPU engine in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sm120.core.errors import PlanError
from sm120.plan.hardware import divisors, spelled
from sm120.recipe.schema import ModelDims

# DeepSeek V3.2-style sparse MLA in fp8_ds_mla: 512 fp8 NoPE + 4 x fp32 scales + 64 bf16 RoPE.
FP8_DS_MLA_BYTES = 656
# DeepSeek-V4 fp8_ds_mla: 448 fp8 NoPE + 128 RoPE + 8 scale bytes per stored (compressed) token.
DSV4_STATE_BYTES = 584
# DeepSeek-V4 nvfp4_ds_mla (danielwoz/vllm-dspark-nvfp4, rtx6kpro models/ds4dspark-nvfp4-kv.md
# "KV Page Layout"): 448 E2M1 nibbles (224 B) + 64 bf16 RoPE (128 B) + the same 8-byte footer.
DSV4_NVFP4_BYTES = 360
# FlashMLA reads DeepSeek-V4 pages in 576-byte rows, so every page is padded to a multiple.
DSV4_PAGE_ALIGN = 576
DSV4_SWA_BLOCK = 64  # the sliding-window cache's own block size
# Compressor state (fp32 partial sums of the tokens not yet compressed): (block, window) per ratio.
DSV4_STATE_CACHES = {4: (4, 8), 128: (8, 128)}

_ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_FP8_NAMES = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(value: int, multiple: int) -> int:
    return cdiv(value, multiple) * multiple


@dataclass(frozen=True)
class KVDtype:
    name: str  # what the report shows
    fp8: bool
    nvfp4: bool = False
    element_bytes: int = 1
    ds_record: int = DSV4_STATE_BYTES  # one stored DeepSeek-V4 latent token (fp8_ds_mla's)


def resolve_kv_dtype(arg: str | None, dims: ModelDims) -> KVDtype:
    """The dtype the engine stores KV in: --kv-cache-dtype, or with `auto` the checkpoint's
    FP8 KV-cache quantization if it has one, else the activation dtype."""
    name = (arg or "auto").lower()
    if name == "auto":
        if dims.kv_cache_fp8:
            return KVDtype("fp8 (checkpoint's kv_cache_quant_algo)", fp8=True)
        return KVDtype(dims.dtype, fp8=False, element_bytes=_ELEMENT_BYTES[dims.dtype])
    if name in _FP8_NAMES:
        return KVDtype(name, fp8=True)
    if name in _ELEMENT_BYTES:
        return KVDtype(name, fp8=False, element_bytes=_ELEMENT_BYTES[name])
    if name == "nvfp4":
        return KVDtype(name, fp8=False, nvfp4=True)
    if name == "nvfp4_ds_mla":
        return KVDtype(name, fp8=False, nvfp4=True, ds_record=DSV4_NVFP4_BYTES)
    raise PlanError(
        f"kv-cache-dtype '{arg}' is not one the planner models",
        "use auto, bfloat16, fp8 or fp8_e4m3",
    )


@dataclass(frozen=True)
class WindowCache:
    """Caches bounded by a window (sliding-window attention, compressor state). A request
    keeps window - 1 tokens plus one prefill chunk in them, and one more block because the
    window need not start at a block boundary (vLLM's SlidingWindowSpec)."""

    name: str
    tables: int  # block tables of this kind, each drawing blocks from the shared pool
    window: int
    block_size: int
    # What one of its pages counts against a request where the engine counts window pages in
    # bytes (vLLM 0.26's DeepSeek-V4 packing); None: each page takes a whole pool block.
    page_bytes: int | None = None

    def blocks(self, context: int, chunk_tokens: int) -> int:
        held = min(self.window - 1 + chunk_tokens, context)
        return self.tables * (cdiv(held, self.block_size) + 1)


@dataclass(frozen=True)
class KVLayout:
    summary: str  # how one rank stores a token, in words
    block_size: int  # tokens per block on one rank
    bytes_per_block: int  # what one block of the shared pool costs on one rank
    dcp: int = 1  # decode context parallel: each rank keeps 1/dcp of a sequence
    windows: tuple[WindowCache, ...] = ()
    chunk_tokens: int = 0  # tokens in flight per request, for the window caches
    # The unit a request's byte-counted window pages are rounded up in (vLLM 0.26 DeepSeek-V4:
    # the compressed layers' pages of one block); None: bytes_per_block.
    window_unit_bytes: int | None = None
    # Hybrid linear-attention models (hybrid.py): block tables of per-token layers, and the
    # fixed number of state blocks a request holds whatever its length.
    token_tables: int = 1
    state_blocks: int = 0

    def blocks_per_request(self, context: int) -> int:
        blocks = self.token_tables * cdiv(cdiv(context, self.dcp), self.block_size)
        blocks += self.state_blocks
        paged = 0
        for cache in self.windows:
            held = cache.blocks(context, self.chunk_tokens)
            if cache.page_bytes is None:
                blocks += held
            else:
                paged += held * cache.page_bytes
        return blocks + cdiv(paged, self.window_unit_bytes or self.bytes_per_block)

    def bytes_per_request(self, context: int) -> int:
        return self.bytes_per_block * self.blocks_per_request(context)

    def bytes_per_token(self, context: int) -> float:
        """Bytes one rank spends per token of a `context`-token request, block rounding and
        window caches included."""
        return self.bytes_per_request(context) / context


@dataclass(frozen=True)
class Pool:
    num_blocks: int
    tokens: int  # as the engine's "KV cache size" line reports it for the planned context
    concurrency: float  # requests of the planned context that fit at once
    max_context: int  # the longest single request that fits, capped at the model's limit


def pool(layout: KVLayout, kv_bytes: int, context: int, cap: int) -> Pool:
    num_blocks = max(kv_bytes // layout.bytes_per_block, 0)
    concurrency = num_blocks / layout.blocks_per_request(context)
    return Pool(
        num_blocks=num_blocks,
        tokens=int(concurrency * context),
        concurrency=concurrency,
        max_context=longest_context(layout, num_blocks, cap),
    )


def longest_context(layout: KVLayout, num_blocks: int, cap: int) -> int:
    """Largest context <= cap whose blocks fit (blocks_per_request only grows with it)."""
    if layout.blocks_per_request(1) > num_blocks:
        return 0
    low, high = 1, cap
    while low < high:
        middle = (low + high + 1) // 2
        if layout.blocks_per_request(middle) <= num_blocks:
            low = middle
        else:
            high = middle - 1
    return low


def _check_dcp(tp: int, dcp: int) -> None:
    if dcp < 1 or tp % dcp:
        choices = spelled(divisors(tp)) if tp >= 1 else "1"
        raise PlanError(
            f"tensor-parallel-size {tp} is not divisible by decode-context-parallel-size {dcp}",
            f"pick a DCP that divides TP ({choices} for TP {tp})",
        )


def _need(value: int | None, field: str) -> int:
    if value is None:
        raise PlanError(
            f"model.dims has no {field}, which this attention family needs",
            "pass --model-dir with the checkpoint's config.json, or add it to model.dims",
        )
    return value


def full_attention(
    dims: ModelDims, tp: int, dcp: int, dtype: KVDtype, block_size: int, extra_layers: int
) -> KVLayout:
    """Per layer and token: K and V for this rank's KV heads. Ranks beyond the number of KV
    heads hold copies; only those copies can be traded for DCP."""
    _check_dcp(tp, dcp)
    heads = _need(dims.num_key_value_heads or dims.num_attention_heads, "num_key_value_heads")
    head_dim = _need(dims.head_dim, "head_dim")
    if (heads % tp) if tp <= heads else (tp % heads):
        raise PlanError(
            f"tensor-parallel-size {tp} does not fit the model's {heads} KV heads",
            f"use a TP that divides {heads} or a multiple of it",
        )
    per_rank = max(1, heads // tp)
    copies = max(1, tp // heads)
    if dcp > copies:
        raise PlanError(
            f"decode-context-parallel-size {dcp} needs duplicated KV heads, but TP {tp} over "
            f"{heads} KV heads leaves {copies} cop{'y' if copies == 1 else 'ies'} per head",
            "use decode-context-parallel-size 1: the KV heads are already sharded",
        )
    side = head_dim // 2 + head_dim // 16 if dtype.nvfp4 else head_dim * dtype.element_bytes
    layers = dims.num_hidden_layers + extra_layers
    per_token = layers * 2 * per_rank * side
    return KVLayout(
        summary=f"{layers} layers x K,V x {per_rank} KV head(s)/rank x {side} B = "
        f"{per_token:,} B/token",
        block_size=block_size,
        bytes_per_block=per_token * block_size,
        dcp=dcp,
    )


def mla(
    dims: ModelDims,
    tp: int,
    dcp: int,
    dtype: KVDtype,
    block_size: int,
    extra_layers: int,
    indexer_layers: int | None = None,
) -> KVLayout:
    """MLA keeps one latent per token and layer, the same on every TP rank (one KV head), so
    only DCP shards it. Sparse (DSA) models add an indexer key on the layers that own one."""
    _check_dcp(tp, dcp)
    latent = _need(dims.kv_lora_rank, "kv_lora_rank") + _need(
        dims.qk_rope_head_dim, "qk_rope_head_dim"
    )
    layers = dims.num_hidden_layers + extra_layers
    sparse = indexer_layers is not None
    if sparse and dtype.fp8:
        # fp8 becomes the fp8_ds_mla layout on sparse MLA: fp8 latent, an fp32 scale per 128,
        # bf16 RoPE (656 B for 512 + 64; GLM-5.3's 512 + 0: the b12x fork's 528-byte record)
        rank, rope = dims.kv_lora_rank or 0, dims.qk_rope_head_dim or 0
        per_layer = rank + rank // 128 * 4 + rope * 2
    elif dtype.nvfp4:
        raise PlanError("nvfp4 KV cache has no MLA layout on SM12x (F07)", "use fp8")
    else:
        per_layer = latent * dtype.element_bytes
    per_token = layers * per_layer
    summary = f"{layers} layers x {per_layer} B"
    if indexer_layers:
        index_dim = _need(dims.index_head_dim, "index_head_dim")
        index_bytes = index_dim + index_dim // 128 * 4  # fp8 keys + one fp32 scale per 128
        per_token += indexer_layers * index_bytes
        summary += f" + {indexer_layers} indexer layers x {index_bytes} B"
    return KVLayout(
        summary=f"{summary} = {per_token:,} B/token (MLA: the same on every TP rank)",
        block_size=block_size,
        bytes_per_block=per_token * block_size,
        dcp=dcp,
    )


def approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """vLLM's choice of layer tuples per block: the divisor >= lower_bound that pads the
    fewest layers (ties go to the larger one)."""
    best, best_pad = lower_bound, None
    for candidate in range(lower_bound, max(values) + 1):
        pad = sum((candidate - value % candidate) % candidate for value in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = candidate, pad
    return best


def check_deepseek_v4(dims: ModelDims, dcp: int, dtype: KVDtype, block_size: int) -> None:
    """What every engine generation of DeepSeek-V4 rejects."""
    if dcp != 1:
        raise PlanError(
            "DeepSeek-V4 cannot use decode-context-parallel-size > 1: its sliding-window "
            "caches are not sharded",
            "set decode-context-parallel-size 1",
        )
    if not dtype.fp8 and dtype.name != "nvfp4_ds_mla":
        raise PlanError(
            f"DeepSeek-V4 needs an fp8 KV cache, got {dtype.name} (F14)",
            "set kv-cache-dtype fp8",
        )
    if block_size % 128:
        raise PlanError(
            f"DeepSeek-V4 needs a block size that is a multiple of 128, got {block_size}",
            "use --block-size 256 as the recipes do",
        )
    if not dims.compress_ratios:
        _need(None, "compress_ratios")


def deepseek_v4(
    dims: ModelDims, dcp: int, dtype: KVDtype, block_size: int, extra_layers: int, chunk: int
) -> KVLayout:
    """DeepSeek-V4's compressed attention as vLLM packs it: every block holds one page per
    (layer tuple, page size) -- C4 latent, C4 indexer key, C128 latent -- and the
    sliding-window caches and compressor states of each request draw blocks of the same
    size from the same pool, bounded by their windows. This is the recipe's engine (jasl/vllm
    PR-41834 branch); vLLM 0.26 packs differently (planner/dsv4_packed.py)."""
    check_deepseek_v4(dims, dcp, dtype, block_size)
    ratios = dims.compress_ratios or ()
    backbone = list(ratios[: dims.num_hidden_layers])
    c4, c128 = backbone.count(4), backbone.count(128)
    index_dim = _need(dims.index_head_dim, "index_head_dim")
    index_bytes = index_dim + index_dim // 128 * 4
    pages = {
        "C4 latent": (round_up(block_size // 4 * dtype.ds_record, DSV4_PAGE_ALIGN), c4),
        "C4 indexer": (round_up(block_size // 4 * index_bytes, DSV4_PAGE_ALIGN), c4),
        "C128 latent": (round_up(block_size // 128 * dtype.ds_record, DSV4_PAGE_ALIGN), c128),
    }
    present = {name: page for name, page in pages.items() if page[1]}
    most_common = max(count for _, count in present.values())
    swa_layers = dims.num_hidden_layers + extra_layers
    state_tuples = {ratio: backbone.count(ratio) for ratio in DSV4_STATE_CACHES}
    counts = [most_common, swa_layers, *(n for n in state_tuples.values() if n)]
    tuples = approximate_gcd(counts, lower_bound=most_common)
    windows = [
        WindowCache(
            "sliding window",
            cdiv(swa_layers, tuples),
            _need(dims.sliding_window, "sliding_window"),
            DSV4_SWA_BLOCK,
        )
    ]
    for ratio, (state_block, window) in DSV4_STATE_CACHES.items():
        if state_tuples[ratio]:
            windows.append(
                WindowCache(
                    f"C{ratio} compressor state",
                    cdiv(state_tuples[ratio], tuples),
                    window,
                    state_block,
                )
            )
    tuple_bytes = sum(page for page, _ in present.values())
    detail = ", ".join(f"{name} {page:,} B" for name, (page, _) in present.items())
    return KVLayout(
        summary=f"{c4} C4 + {c128} C128 compressed layers, {tuples} layer tuples per "
        f"{block_size}-token block ({detail}); {swa_layers} sliding-window caches and the "
        "compressor states take window-bounded blocks per request",
        block_size=block_size,
        bytes_per_block=tuple_bytes * tuples,
        dcp=dcp,
        windows=tuple(windows),
        chunk_tokens=chunk,
    )
