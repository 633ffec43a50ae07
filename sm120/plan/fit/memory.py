"""From a resolved launch plan to memory numbers for one TP / DCP layout.

KV memory per GPU is either given (--kv-memory-gib, e.g. from the engine's "Available KV
cache memory" line) or estimated as

    gpu memory x gpu-memory-utilization - weights / TP - ACTIVATION_OVERHEAD_GIB

Weights are the checkpoint's files (--model-dir), else the recipe's model.weights_gib, else
an estimate counted from model.dims (resident.py), which the plan names as such.

The overhead stands for what vLLM's profiling run takes besides weights and KV: peak
activations of one max-num-batched-tokens step, the CUDA-graph pool and non-torch memory
(NCCL buffers, cuBLAS workspaces). Seed 002 implies about 1.3 GiB (GLM-5.2, 8 captured
sizes); long-context DeepSeek-V4 sizes sparse-attention workspaces by max-model-len and can
need several GiB more (seed 001). Estimates are therefore a first answer; the engine's own
line is exact.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from sm120.core.errors import PlanError
from sm120.plan.fit import kv
from sm120.plan.fit.dims import GIB, PlannerDims
from sm120.plan.fit.dsv4_packed import deepseek_v4_packed
from sm120.plan.fit.dsv41 import DEFAULT_SWA_BLOCK, deepseek_v41
from sm120.plan.fit.hybrid import KERNEL_BLOCK, HybridShape, hybrid, mamba_mode, state_bytes
from sm120.plan.fit.resident import SOURCE as ESTIMATE_SOURCE
from sm120.plan.fit.resident import WeightEstimate, estimate_gap, estimate_weights
from sm120.plan.hardware import divisors, spelled
from sm120.plan.resolve import LaunchPlan

ACTIVATION_OVERHEAD_GIB = 1.5
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
# vLLM's default prefill chunk for the API server on GPUs with 70 GiB or more.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# vLLM's default block size per family when neither the recipe nor model.dims sets one.
_DEFAULT_BLOCK = {
    "full": 16,
    "mla": 16,
    "mla_sparse_dsa": 64,
    "dsv4_compressed": 256,
    "dsv41_ced": 256,
    "gdn_hybrid": 16,
    "kda_mla_hybrid": 64,
    "kda_dsa_hybrid": 64,
}
HYBRIDS = ("gdn_hybrid", "kda_mla_hybrid", "kda_dsa_hybrid")
# The first upstream release whose DeepSeek-V4 packing the planner checked (GPU proof).
DSV4_PACKED_SINCE = (0, 26)
_RELEASE = re.compile(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:(?:rc|\.post|\.dev)\d+)?(?:\+[\w.]+)?")


@dataclass(frozen=True)
class PlanSpec:
    """Everything that stays fixed while recommendations try other TP / DCP layouts."""

    attention: str
    dims: PlannerDims
    kv_dtype: kv.KVDtype
    block_size: int
    draft_layers: int  # MTP layers, which keep their own KV
    chunk_tokens: int
    context: int  # the max-model-len planned for
    gpus: int
    gpu_mem_gib: float | None
    utilization: float
    kv_memory_gib: float | None  # given per GPU; None means estimate
    quantization: str
    engine_version: str = ""  # the engine whose allocator rules the figures follow
    # hybrid linear-attention models (hybrid.py) and DeepSeek-V4.1's window pages
    spec_tokens: int = 0  # speculative tokens: recurrent layers keep a state block for each
    mamba_cache_mode: str = "none"
    mamba_ssm_cache_dtype: str | None = None
    swa_block_size: int = DEFAULT_SWA_BLOCK
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes: the engine's own pool
    # resident weights counted from model.dims when no source states them (resident.py)
    weights_estimate: WeightEstimate | None = None

    @property
    def model_limit(self) -> int:
        return self.dims.dims.max_position_embeddings


@dataclass(frozen=True)
class Outcome:
    tp: int
    dcp: int
    layout: kv.KVLayout
    weights_gib_per_gpu: float | None
    kv_memory_gib_per_gpu: float
    kv_memory_source: str
    pool: kv.Pool

    def as_dict(self, spec: PlanSpec) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "dcp": self.dcp,
            "weights_gib_per_gpu": _round(self.weights_gib_per_gpu),
            "kv_memory_gib_per_gpu": round(self.kv_memory_gib_per_gpu, 3),
            "kv_pool_tokens": self.pool.tokens,
            "max_model_len_fit": self.pool.max_context,
            "concurrency_at_max_len": round(self.pool.concurrency, 3),
            "fits_max_model_len": self.fits(spec),
        }

    def fits(self, spec: PlanSpec) -> bool:
        return self.pool.max_context >= spec.context


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _int_arg(plan: LaunchPlan, name: str, default: int) -> int:
    value = plan.arg(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value


def draft_layers(plan: LaunchPlan, dims: PlannerDims) -> int:
    """MTP speculative decoding runs the checkpoint's next-token layers, which own KV."""
    config = plan.arg("speculative-config")
    method = str(config.get("method", "")) if isinstance(config, dict) else ""
    return dims.dims.num_nextn_predict_layers if "mtp" in method else 0


def speculative_tokens(plan: LaunchPlan) -> int:
    config = plan.arg("speculative-config")
    tokens = config.get("num_speculative_tokens", 0) if isinstance(config, dict) else 0
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0


def build_spec(
    plan: LaunchPlan,
    dims: PlannerDims,
    gpus: int,
    gpu_mem_gib: float | None,
    kv_memory_gib: float | None,
    max_model_len: int | None,
) -> PlanSpec:
    if gpus < 1:
        raise PlanError(f"--gpus must be at least 1, got {gpus}", "e.g. --gpus 4")
    if gpu_mem_gib is not None and gpu_mem_gib <= 0:
        raise PlanError(
            f"--gpu-mem-gib must be positive, got {gpu_mem_gib:g}",
            "an RTX PRO 6000 has 94.97 GiB",
        )
    if kv_memory_gib is not None and kv_memory_gib <= 0:
        raise PlanError(
            f"--kv-memory-gib must be positive, got {kv_memory_gib:g}",
            "take it from the engine's 'Available KV cache memory' line",
        )
    context = (
        max_model_len
        if max_model_len is not None
        else _int_arg(plan, "max-model-len", dims.dims.max_position_embeddings)
    )
    if context == -1 and max_model_len is None:
        # vLLM's -1 fits the context to the KV pool, up to the model's limit: plan that limit;
        # the plan's longest context is the length the engine settles on
        context = dims.dims.max_position_embeddings
    if context < 1:
        raise PlanError(f"max-model-len must be at least 1, got {context}", "e.g. 131072")
    utilization = plan.arg("gpu-memory-utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
    attention = plan.model.attention
    drafts = draft_layers(plan, dims)
    estimate = None
    if dims.weights_gib is None:
        estimate = estimate_weights(dims, attention, plan.model.quantization, drafts)
        if estimate is not None:
            dims = dataclasses.replace(dims, weights_source=ESTIMATE_SOURCE)
    block = _int_arg(plan, "block-size", dims.dims.block_size or _DEFAULT_BLOCK.get(attention, 16))
    return PlanSpec(
        attention=attention,
        dims=dims,
        kv_dtype=kv.resolve_kv_dtype(plan.arg("kv-cache-dtype"), dims.dims),
        block_size=block,
        draft_layers=drafts,
        chunk_tokens=_int_arg(plan, "max-num-batched-tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS),
        context=context,
        gpus=gpus,
        gpu_mem_gib=gpu_mem_gib if gpu_mem_gib is not None else plan.hardware.gpu_memory_gib,
        utilization=float(utilization),
        kv_memory_gib=kv_memory_gib,
        quantization=plan.model.quantization,
        engine_version=plan.image.engine_version,
        spec_tokens=speculative_tokens(plan),
        mamba_cache_mode=_mamba_mode(plan, attention),
        mamba_ssm_cache_dtype=_str_arg(plan, "mamba-ssm-cache-dtype"),
        swa_block_size=_int_arg(plan, "swa-block-size", DEFAULT_SWA_BLOCK),
        kv_cache_memory_bytes=_int_arg(plan, "kv-cache-memory-bytes", 0) or None,
        weights_estimate=estimate,
    )


def _str_arg(plan: LaunchPlan, name: str) -> str | None:
    value = plan.arg(name)
    return value if isinstance(value, str) else None


def _mamba_mode(plan: LaunchPlan, attention: str) -> str:
    """Prefix caching is off by default for hybrid models (vLLM 0.26 arg_utils.py)."""
    if attention not in HYBRIDS:
        return "none"
    return mamba_mode(plan.arg("enable-prefix-caching") is True, _str_arg(plan, "mamba-cache-mode"))


def layout_for(spec: PlanSpec, tp: int, dcp: int) -> kv.KVLayout:
    dims = spec.dims.dims
    heads = dims.num_attention_heads
    if heads and heads % tp:
        # the sizes that fit this machine (nine GPUs take 1, 2, 3, 4, 6 or 8 of 96 heads)
        fits = [size for size in divisors(heads) if size <= max(spec.gpus, tp)]
        raise PlanError(
            f"tensor-parallel-size {tp} does not divide the model's {heads} attention heads",
            f"use a TP that divides the head count ({spelled(fits)})",
        )
    args = (spec.kv_dtype, spec.block_size, spec.draft_layers)
    if spec.kv_dtype.name == "nvfp4_ds_mla" and spec.attention != "dsv4_compressed":
        raise PlanError(
            f"kv-cache-dtype nvfp4_ds_mla is DeepSeek-V4's 4-bit layout, not one for "
            f"attention '{spec.attention}'",
            "use fp8 (or nvfp4 on full attention)",
        )
    if spec.attention == "full":
        return kv.full_attention(dims, tp, dcp, *args)
    if spec.attention == "mla":
        return kv.mla(dims, tp, dcp, *args)
    if spec.attention == "mla_sparse_dsa":
        return kv.mla(dims, tp, dcp, *args, indexer_layers=indexer_layers(spec))
    if spec.attention == "dsv4_compressed":
        layout = deepseek_v4_packed if packs_dsv4_upstream(spec.engine_version) else kv.deepseek_v4
        return layout(dims, dcp, *args, chunk=spec.chunk_tokens)
    if spec.attention == "dsv41_ced":
        swa = spec.swa_block_size
        return deepseek_v41(dims, dcp, *args, chunk=spec.chunk_tokens, swa_block=swa)
    if spec.attention in HYBRIDS:
        return hybrid(
            hybrid_shape(spec, tp, dcp),
            spec.block_size,
            spec.mamba_cache_mode,
            spec.spec_tokens,
            dcp,
        )
    raise PlanError(
        f"attention '{spec.attention}' has no KV model in the planner yet",
        "size the KV cache from the engine's startup log (sm120 launch shows it)",
    )


def hybrid_shape(spec: PlanSpec, tp: int, dcp: int) -> HybridShape:
    """The attention half of a hybrid model, one layer and token on one rank, and its state."""
    dims = spec.dims.dims
    linear = dims.linear_layers
    if linear is None or linear >= dims.num_hidden_layers:
        raise PlanError(
            "model.dims.linear_layers must count the recurrent layers, fewer than "
            "num_hidden_layers",
            "pass --model-dir with the checkpoint's config.json (layer_types / kda_layers)",
        )
    attention_layers = dims.num_hidden_layers - linear + spec.draft_layers
    one_layer = dims.model_copy(update={"num_hidden_layers": 1})
    if spec.attention == "gdn_hybrid":
        family, what = "full", "K,V"
        one = kv.full_attention(one_layer, tp, dcp, spec.kv_dtype, 1, 0)
    else:
        # GLM-5.3's DSA layers store the sparse-MLA record (fp8_ds_mla with fp8); Kimi's MLA
        # stores the plain latent
        sparse = 0 if spec.attention == "kda_dsa_hybrid" else None
        family, what = "mla", "MLA latent"
        one = kv.mla(one_layer, tp, dcp, spec.kv_dtype, 1, 0, indexer_layers=sparse)
    token = one.bytes_per_block
    what = f"{what} {token:,} B/token"
    if dims.index_head_dim and (dims.index_compress_ratio or spec.attention == "kda_dsa_hybrid"):
        # indexer keys beside the attention KV (Qwen3.8's compressed indexer, GLM-5.3's DSA):
        # fp8 + an fp32 scale per 128, one per index_compress_ratio tokens
        ratio = dims.index_compress_ratio or 1
        key = dims.index_head_dim + dims.index_head_dim // 128 * 4
        token += kv.cdiv(key, ratio)
        what += f" + a {key} B indexer key per {ratio} token(s)"
    return HybridShape(
        attention_layers=attention_layers,
        token_bytes=token,
        linear_layers=linear,
        state_bytes=state_bytes(dims, tp, spec.spec_tokens, spec.mamba_ssm_cache_dtype),
        kernel_block=KERNEL_BLOCK[family],
        summary=f"{what} on each",
    )


def packs_dsv4_upstream(engine_version: str) -> bool:
    """The image's engine packs DeepSeek-V4 the way vLLM 0.26 does: an upstream release from
    0.26 on. Fork refs (the recipe's sm120-pr-41834-...) keep the fork's packing."""
    release = _RELEASE.fullmatch(engine_version.strip())
    return release is not None and (int(release[1]), int(release[2])) >= DSV4_PACKED_SINCE


def indexer_layers(spec: PlanSpec) -> int:
    """Layers that allocate an indexer K-cache on the image's engine: the b12x fork builds an
    indexer on every layer (skip layers only skip the computation); upstream builds it only
    on full layers. MTP layers always have one."""
    dims = spec.dims
    every = dims.dims.num_hidden_layers + spec.draft_layers
    if dims.dims.dsa_indexer_cache == "full_layers" and dims.indexer_full_layers is not None:
        return dims.indexer_full_layers + spec.draft_layers
    return every


def weights_per_gpu(spec: PlanSpec, tp: int) -> float | None:
    """A stated size splits evenly (it is the engine's per-GPU figure times the TP it was
    measured at); an estimate keeps its replicated parts whole on every rank."""
    total = spec.dims.weights_gib
    if total is not None:
        return total / tp
    estimate = spec.weights_estimate
    return None if estimate is None else estimate.per_gpu_gib(tp)


def kv_memory(spec: PlanSpec, tp: int) -> tuple[float, str]:
    if spec.kv_memory_gib is not None:
        return spec.kv_memory_gib, "given"
    if spec.kv_cache_memory_bytes is not None:
        # the engine skips its memory profile and takes exactly this much KV per GPU
        return spec.kv_cache_memory_bytes / GIB, "kv-cache-memory-bytes"
    if spec.gpu_mem_gib is None:
        raise PlanError(
            "GPU memory is unknown: the recipe names none",
            "pass --gpu-mem-gib, e.g. 94.97, or --kv-memory-gib",
        )
    weights = weights_per_gpu(spec, tp)
    if weights is None:
        gap = estimate_gap(spec.dims, spec.quantization) or "no estimate"
        raise PlanError(
            f"the resident weight size is unknown: the recipe has no model.weights_gib and {gap}",
            "pass --model-dir with the weights, or --kv-memory-gib",
        )
    usable = spec.gpu_mem_gib * spec.utilization
    return usable - weights - ACTIVATION_OVERHEAD_GIB, "estimated"


def evaluate(spec: PlanSpec, tp: int, dcp: int) -> Outcome:
    layout = layout_for(spec, tp, dcp)
    memory, source = kv_memory(spec, tp)
    cap = max(spec.model_limit, spec.context)
    return Outcome(
        tp=tp,
        dcp=dcp,
        layout=layout,
        weights_gib_per_gpu=weights_per_gpu(spec, tp),
        kv_memory_gib_per_gpu=memory,
        kv_memory_source=source,
        pool=kv.pool(layout, max(int(memory * GIB), 0), spec.context, cap),
    )


def planned_layout(plan: LaunchPlan) -> tuple[int, int]:
    return (
        _int_arg(plan, "tensor-parallel-size", 1),
        _int_arg(plan, "decode-context-parallel-size", 1),
    )
