"""DeepSeek-V4's KV cache as vLLM 0.26 packs it (upstream's packed layout).

vLLM 0.26.0 (vllm/models/deepseek_v4, vllm/v1/kv_cache_interface.py, vllm/v1/core/
kv_cache_utils.py) registers, with --kv-cache-dtype fp8 turned into fp8_ds_mla:

  per compressed layer (ratio r): MLAAttentionSpec, block B, B/r x 584 B, padded to 576
  per C4 layer, the indexer key:  MLAAttentionSpec, block B, B/4 x 132 B, padded to 576
  per layer (MTP ones if run):    SWA cache, SlidingWindowMLASpec, block 64, window
                                  sliding_window, 64 x 584 B, padded to 576
  per compressor (C4 attention, C4 indexer, C128 attention): fp32 state, SlidingWindowMLASpec
                                  with block 4 / window 8 (C4) or block 8 / window 128 (C128),
                                  block x 2 x (1 + overlap) x head_dim x 4 B, padded to 576

The full-MLA specs form group 0; the window specs are grouped by (block, window). Group 0's
"layer tuples" (its most common page size's count) and each window group's count go through
_approximate_gcd; each window group is padded up to group 0's page sizes and split into
groups of at most that many tuples. The pool packs one page per (slot, page size) into every
block: num_blocks = kv_bytes // sum(page size x slots), slots being the most pages of that
size any one group holds. The reported figure is
int(num_blocks / cdiv(request_bytes, group 0's page bytes) x max_model_len), where
request_bytes counts every group's pages for one max_model_len request: cdiv(len, B) for
group 0, cdiv(min(window - 1 + in-flight, len), block) + 1 for a window group, in-flight
being max-num-batched-tokens x 2 under async scheduling (vLLM's max_in_flight_tokens; the
planner does not model --no-async-scheduling, which makes it x 1).

The GPU proof's reduced DeepSeek-V4 (8 layers, ratios 0 0 4 128 4 128 4 128, B 256, 32,768
tokens, 4 GiB, max-num-batched-tokens 4096) comes out as the engine printed, at TP 1 and 2
(nothing here depends on TP: MLA keeps one KV head):
  pages: C4 37,440, indexer 8,640, C128 1,728, SWA 37,440, C4 / C128 state 32,768 -> 32,832
  (padded to 37,440 in their group), indexer state 8,192 -> 8,640
  tuples: approximate_gcd([3, 8, 3, 3], lower_bound=3) = 3; SWA splits into 3 + 3 + 2 layers
  block: 3 x (37,440 + 8,640 + 1,728) = 143,424 B; 4 GiB // 143,424 = 29,945 blocks
  request: 128 x 143,424 + 131 x 8 x 37,440 (SWA) + 2,051 x 3 x (37,440 + 8,640) (C4
  states) + 1,041 x 3 x 37,440 (C128 states) -> cdiv(..., 143,424) = 3,194 blocks
  29,945 / 3,194 = 9.375 -> 307,212 tokens ("Maximum concurrency ... 9.38x").
"""

from __future__ import annotations

from collections import Counter, defaultdict

from sm120.plan.fit.kv import (
    DSV4_PAGE_ALIGN,
    DSV4_STATE_CACHES,
    DSV4_SWA_BLOCK,
    KVDtype,
    KVLayout,
    WindowCache,
    _need,
    approximate_gcd,
    cdiv,
    check_deepseek_v4,
    round_up,
)
from sm120.recipe.schema import ModelDims

# vLLM 0.26 runs with async scheduling by default: two batches in flight, each of up to
# max-num-batched-tokens, keep window blocks alive (VllmConfig.max_in_flight_tokens).
BATCHES_IN_FLIGHT = 2
_INDEXER_STATE = "C4 indexer"


def _page(bytes_: int) -> int:
    return round_up(bytes_, DSV4_PAGE_ALIGN)


def _state_page(ratio: int, head_dim: int) -> int:
    """fp32 kv + score partial sums, doubled for C4's overlapping windows."""
    block, _ = DSV4_STATE_CACHES[ratio]
    overlap = 2 if ratio == 4 else 1
    return _page(block * 2 * overlap * head_dim * 4)


def deepseek_v4_packed(
    dims: ModelDims, dcp: int, dtype: KVDtype, block_size: int, extra_layers: int, chunk: int
) -> KVLayout:
    """The layout above for `dims`; `chunk` is max-num-batched-tokens."""
    check_deepseek_v4(dims, dcp, dtype, block_size)
    backbone = list((dims.compress_ratios or ())[: dims.num_hidden_layers])
    c4, c128 = backbone.count(4), backbone.count(128)
    head_dim = _need(dims.head_dim, "head_dim")
    index_dim = _need(dims.index_head_dim, "index_head_dim")
    latent = {
        "C4 latent": (_page(block_size // 4 * dtype.ds_record), c4),
        "C4 indexer": (_page(block_size // 4 * (index_dim + index_dim // 128 * 4)), c4),
        "C128 latent": (_page(block_size // 128 * dtype.ds_record), c128),
    }
    full_pages = [page for page, count in latent.values() for _ in range(count)]
    swa_layers = dims.num_hidden_layers + extra_layers
    window_groups = {
        "sliding window": (
            DSV4_SWA_BLOCK,
            _need(dims.sliding_window, "sliding_window"),
            [_page(DSV4_SWA_BLOCK * dtype.ds_record)] * swa_layers,
        ),
        "C4 compressor state": (
            *DSV4_STATE_CACHES[4],
            [_state_page(4, head_dim)] * c4 + [_state_page(4, index_dim)] * c4,
        ),
        "C128 compressor state": (*DSV4_STATE_CACHES[128], [_state_page(128, head_dim)] * c128),
    }
    window_groups = {name: group for name, group in window_groups.items() if group[2]}
    counts = [_tuples(full_pages), *(_tuples(pages) for _, _, pages in window_groups.values())]
    tuples = approximate_gcd(counts, lower_bound=counts[0])
    sizes = sorted(set(full_pages))
    slots = Counter(full_pages)  # pages of each size in one block of the pool
    windows: list[WindowCache] = []
    for name, (block, window, pages) in window_groups.items():
        padded = [min(size for size in sizes if size >= page) for page in pages]
        for layers, group_bytes in _split(padded, tuples):
            for size, count in Counter(layers).items():
                slots[size] = max(slots[size], count)
            _add_window(windows, WindowCache(name, 1, window, block, group_bytes))
    full_bytes = sum(full_pages)
    block_bytes = sum(size * count for size, count in slots.items())
    packed = " + ".join(f"{count} x {size:,} B" for size, count in sorted(slots.items())[::-1])
    detail = ", ".join(f"{name} {page:,} B" for name, (page, count) in latent.items() if count)
    swa_groups = sum(w.tables for w in windows if w.name == "sliding window")
    summary = (
        f"{c4} C4 + {c128} C128 compressed layers in {tuples}-tuple groups; a {block_size}-token "
        f"block packs {packed} = {block_bytes:,} B ({detail}; window pages padded to these); "
        f"{swa_layers} sliding-window caches in {swa_groups} groups and the compressor states "
        "add window-bounded pages per request, counted in units of the compressed layers' "
        f"{full_bytes:,} B (vLLM 0.26 packing)"
    )
    return KVLayout(
        summary=summary,
        block_size=block_size,
        bytes_per_block=block_bytes,
        dcp=dcp,
        windows=tuple(windows),
        chunk_tokens=chunk * BATCHES_IN_FLIGHT,
        window_unit_bytes=full_bytes,
    )


def _tuples(pages: list[int]) -> int:
    """UniformTypeKVCacheSpecs.get_num_layer_tuples: the most common page size's count."""
    return Counter(pages).most_common(1)[0][1]


def _split(padded: list[int], tuples: int) -> list[tuple[list[int], int]]:
    """A window group cut into groups of at most `tuples` layer tuples (vLLM zips the layers
    of each page size into tuples and deals them round-robin): each part's pages and bytes.
    Every size has as many layers (a C4 layer has both states), as vLLM asserts."""
    by_size: dict[int, list[int]] = defaultdict(list)
    for page in padded:
        by_size[page].append(page)
    layer_tuples = list(zip(*by_size.values(), strict=True))
    parts = cdiv(len(layer_tuples), tuples)
    split = []
    for index in range(parts):
        layers = [page for layer_tuple in layer_tuples[index::parts] for page in layer_tuple]
        split.append((layers, sum(layers)))
    return split


def _add_window(windows: list[WindowCache], cache: WindowCache) -> None:
    """Groups alike in everything count as several tables of one kind."""
    for index, known in enumerate(windows):
        if (known.name, known.window, known.block_size, known.page_bytes) == (
            cache.name,
            cache.window,
            cache.block_size,
            cache.page_bytes,
        ):
            windows[index] = WindowCache(
                known.name, known.tables + 1, known.window, known.block_size, known.page_bytes
            )
            return
    windows.append(cache)
