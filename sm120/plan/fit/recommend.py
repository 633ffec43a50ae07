"""Flags (F08 would OOM, F24 NVFP4 DeepSeek-V4) and the recommended DCP / TP / max-model-len.

Alternatives vary DCP at the planned TP; with an estimated KV budget they also try every TP
the GPUs allow (a given budget belongs to one TP). A plan that fits is kept as it is: more
DCP than needed costs decode speed (seed 002: ~81 tok/s at DCP 1, ~60 at DCP 4).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from sm120.core.errors import PlanError
from sm120.plan.fit.dims import GIB
from sm120.plan.fit.memory import ACTIVATION_OVERHEAD_GIB, Outcome, PlanSpec, evaluate
from sm120.recipe.schema import Recipe

# Recommended context lengths are rounded down to this, like the seeds' 131072.
_LEN_STEP = 1024


@dataclass(frozen=True)
class Flag:
    id: str
    severity: Literal["error", "warn"]
    message: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Recommendation:
    tp: int
    dcp: int
    max_model_len: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Report:
    spec: PlanSpec
    planned: Outcome
    alternatives: tuple[Outcome, ...]
    flags: tuple[Flag, ...]
    recommendation: Recommendation

    @property
    def failed(self) -> bool:
        return any(flag.severity == "error" for flag in self.flags)


def _try(spec: PlanSpec, tp: int, dcp: int) -> Outcome | None:
    try:
        return evaluate(spec, tp, dcp)
    except PlanError:
        return None  # a layout the model or the engine does not allow


def alternatives(spec: PlanSpec, planned_tp: int) -> list[Outcome]:
    tps = [planned_tp] if spec.kv_memory_gib is not None else range(1, spec.gpus + 1)
    found = []
    for tp in tps:
        for dcp in (d for d in range(1, tp + 1) if tp % d == 0):
            outcome = _try(spec, tp, dcp)
            if outcome is not None:
                found.append(outcome)
    return found


def _round_len(length: int) -> int:
    return length if length < _LEN_STEP else length // _LEN_STEP * _LEN_STEP


def recommend(spec: PlanSpec, planned: Outcome, options: list[Outcome]) -> Recommendation:
    if planned.fits(spec):
        return Recommendation(
            planned.tp,
            planned.dcp,
            spec.context,
            f"the planned layout fits {spec.context:,} tokens "
            f"({planned.pool.concurrency:.2f}x concurrency)",
        )
    fitting = [o for o in options if o.fits(spec)]
    same_tp = [o for o in fitting if o.tp == planned.tp]
    if same_tp:
        best = min(same_tp, key=lambda o: o.dcp)
        return Recommendation(
            best.tp,
            best.dcp,
            spec.context,
            f"DCP {best.dcp} shards the KV across {best.dcp} GPUs: {spec.context:,} tokens fit "
            f"at {best.pool.concurrency:.2f}x concurrency",
        )
    if fitting:
        best = min(fitting, key=lambda o: (o.tp, o.dcp))
        return Recommendation(
            best.tp,
            best.dcp,
            spec.context,
            f"TP {best.tp} leaves room for {spec.context:,} tokens at "
            f"{best.pool.concurrency:.2f}x concurrency",
        )
    candidates = [o for o in options if o.tp == planned.tp] or [planned]
    best = max(candidates, key=lambda o: (o.pool.max_context, -o.dcp))
    length = _round_len(best.pool.max_context)
    if length == 0:
        return Recommendation(
            best.tp, best.dcp, 0, "no layout on these GPUs leaves room for the KV cache"
        )
    return Recommendation(
        best.tp,
        best.dcp,
        length,
        f"no layout fits {spec.context:,} tokens; max-model-len {length:,} fits",
    )


def _fix_text(spec: PlanSpec, recommendation: Recommendation, planned: Outcome) -> str:
    if recommendation.max_model_len == 0:
        return "use more or larger GPUs, or a smaller checkpoint"
    parts = []
    if recommendation.tp != planned.tp:
        parts.append(f"--tensor-parallel-size {recommendation.tp}")
    if recommendation.dcp != planned.dcp:
        parts.append(f"--decode-context-parallel-size {recommendation.dcp}")
    if recommendation.max_model_len != spec.context:
        parts.append(f"--max-model-len {recommendation.max_model_len}")
    return "set " + " ".join(parts) if parts else "keep the planned layout"


def oom_flag(spec: PlanSpec, planned: Outcome, recommendation: Recommendation) -> Flag | None:
    if planned.fits(spec):
        return None
    fix = _fix_text(spec, recommendation, planned)
    if planned.kv_memory_gib_per_gpu <= 0:
        usable = (spec.gpu_mem_gib or 0.0) * spec.utilization
        return Flag(
            "F08",
            "error",
            f"weights need {planned.weights_gib_per_gpu or 0:.1f} GiB per GPU but "
            f"gpu-memory-utilization {spec.utilization:g} leaves {usable:.1f} GiB "
            f"({ACTIVATION_OVERHEAD_GIB:g} GiB of it for activations): no room for KV",
            fix,
        )
    need = planned.layout.bytes_per_request(spec.context) / GIB
    return Flag(
        "F08",
        "error",
        f"max-model-len {spec.context:,} needs {need:.2f} GiB of KV per GPU for one request "
        f"but {planned.kv_memory_gib_per_gpu:.2f} GiB is free: the longest context that fits "
        f"is {planned.pool.max_context:,}",
        fix,
    )


def mxfp4_weights_gib(recipe: Recipe) -> float | None:
    """Resident weights of the recipe's MXFP4 DeepSeek-V4 checkpoint, if it names one."""
    models = [recipe.model, *(v.model for v in recipe.variants.values() if v.model)]
    for model in models:
        if model.attention == "dsv4_compressed" and model.quantization == "mxfp4":
            return model.weights_gib
    return None


def nvfp4_flag(spec: PlanSpec, planned: Outcome, mxfp4_gib: float | None) -> Flag | None:
    if spec.attention != "dsv4_compressed" or spec.quantization != "nvfp4":
        return None
    fix = "use the MXFP4 checkpoint (the default, or --variant mxfp4)"
    nvfp4_gib = spec.dims.weights_gib
    if mxfp4_gib is None or nvfp4_gib is None:
        return Flag("F24", "warn", "NVFP4 weights are ~4 GiB/GPU larger than MXFP4 on SM12x", fix)
    extra = (nvfp4_gib - mxfp4_gib) / planned.tp
    roomier = dataclasses.replace(spec, kv_memory_gib=planned.kv_memory_gib_per_gpu + extra)
    other = evaluate(roomier, planned.tp, planned.dcp)
    return Flag(
        "F24",
        "warn",
        f"NVFP4 weights take {extra:.1f} GiB/GPU more than MXFP4: a {planned.pool.tokens:,}-"
        f"token KV pool instead of {other.pool.tokens:,} ({planned.pool.concurrency:.2f}x "
        f"instead of {other.pool.concurrency:.2f}x concurrency at {spec.context:,})",
        fix,
    )


def build_report(
    spec: PlanSpec, planned_tp: int, planned_dcp: int, mxfp4_gib: float | None
) -> Report:
    planned = evaluate(spec, planned_tp, planned_dcp)
    options = alternatives(spec, planned_tp)
    recommendation = recommend(spec, planned, options)
    flags = [
        flag
        for flag in (
            oom_flag(spec, planned, recommendation),
            nvfp4_flag(spec, planned, mxfp4_gib),
        )
        if flag is not None
    ]
    return Report(spec, planned, tuple(options), tuple(flags), recommendation)


def report_document(report: Report, recipe: str, variants: tuple[str, ...]) -> dict[str, Any]:
    """The `sm120 plan --json` object."""
    spec, planned = report.spec, report.planned
    context = spec.context
    document = {
        "recipe": recipe,
        "variants": list(variants),
        "gpus": spec.gpus,
        "attention": spec.attention,
        "tp": planned.tp,
        "dcp": planned.dcp,
        "max_model_len": context,
        "block_size": spec.block_size,
        "kv_cache_dtype": spec.kv_dtype.name,
        "engine": spec.engine_version,
        "dims_source": spec.dims.source,
        "weights_source": spec.dims.weights_source,
        "weights_gib_per_gpu": None
        if planned.weights_gib_per_gpu is None
        else round(planned.weights_gib_per_gpu, 3),
        "kv_memory_gib_per_gpu": round(planned.kv_memory_gib_per_gpu, 3),
        "kv_memory_source": planned.kv_memory_source,
        "activation_overhead_gib": ACTIVATION_OVERHEAD_GIB
        if planned.kv_memory_source == "estimated"
        else None,
        "kv_layout": planned.layout.summary,
        "kv_bytes_per_token_per_rank": round(planned.layout.bytes_per_token(context), 1),
        "kv_gib_per_request_at_max_len": round(planned.layout.bytes_per_request(context) / GIB, 3),
        "kv_blocks": planned.pool.num_blocks,
        "kv_pool_tokens": planned.pool.tokens,
        "max_model_len_fit": planned.pool.max_context,
        "concurrency_at_max_len": round(planned.pool.concurrency, 3),
        "flags": [flag.as_dict() for flag in report.flags],
        "recommendation": report.recommendation.as_dict(),
        "alternatives": [option.as_dict(spec) for option in report.alternatives],
    }
    if spec.weights_estimate is not None:
        # only where the size is an estimate, so the plans of stated sizes keep their shape
        document["weights_estimate"] = spec.weights_estimate.as_dict()
    return document
