"""The decode roofline: the fastest one request can decode if every byte it needs is read once
at the GPUs' full memory bandwidth.

Decoding one token reads every weight the token passes through plus the KV cache of the
context so far. Tensor-parallel ranks read their shards at the same time; pipeline stages
run one after another for one request, so only the TP ranks add bandwidth:

    tok/s = bandwidth per GPU / (weight bytes one rank reads per token + KV bytes per rank)

Weight bytes come from the checkpoint's config where model.dims carries the attention and MLP
shape (active_bytes.py: attention, indexer, picked and shared experts, LM head, at the widths
the checkpoint stores them). Otherwise they are the resident weights (model.weights_gib, as
the engine reports them) less what a token does not touch: the routed experts the router did
not pick, every routed expert of the MTP layers (only a draft step runs them) and the
embedding table, of which a token reads one row. The resident way counts every other resident
byte as read (replicated copies, engine buffers, higher-precision layers), so it is the
looser bound. KV bytes per rank are the planner's own KV layout for a request of `context`
tokens (sparse attention reads less: the figure stays a bound).

One forward pass makes one token. Speculative decoding verifies 1 + K tokens in one pass that
reads the weights once: the speculative roofline is (1 + accepted drafts) tokens per pass,
where a pass costs the target's read plus K draft steps (an MTP step reads one decoder layer
and the LM head; other drafters are not counted, so that figure is a bound), at the
published acceptance or, without one, with every draft accepted (the ceiling). A published
figure above it is suspect.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from sm120.core.errors import PlanError
from sm120.core.yaml_data import load_yaml
from sm120.plan.fit.active_bytes import (
    ACTIVATION_BYTES,
    EXPERT_BYTES,
    GATED_PROJECTIONS,
    ActiveBytes,
    active_weight_bytes,
)
from sm120.plan.fit.dims import GIB, PlannerDims, load_dims
from sm120.plan.fit.memory import build_spec, layout_for, planned_layout
from sm120.plan.resolve import LaunchPlan

# Published single-request figures are short chats; the roofline beside them reads that much KV.
ROOFLINE_CONTEXT_TOKENS = 2048
GB = 10**9  # bandwidth figures are decimal GB/s

_ACTIVATION_BYTES = ACTIVATION_BYTES
# Drafters whose every step is one more pass of the target's MTP layer; prompt lookup costs
# no weight reads; other drafters are separate checkpoints this roofline does not size.
MTP_METHODS = ("mtp",)
FREE_DRAFT_METHODS = ("ngram", "ngram_gpu", "suffix")


@dataclass(frozen=True)
class GpuBandwidth:
    gbs: float
    source: str


@dataclass(frozen=True)
class Roofline:
    tok_s: float
    context: int
    tensor_parallel: int
    bandwidth: GpuBandwidth
    weight_bytes: float  # read per token, all ranks together
    kv_bytes_per_rank: int
    weight_bytes_per_rank: float = 0.0
    weight_method: str = "resident"  # "config" (counted from model.dims) or "resident"
    draft_step_bytes: float | None = None  # one MTP draft step, all ranks together

    def as_dict(self) -> dict[str, Any]:
        return {
            "decode_tok_s": round(self.tok_s, 1),
            "context_tokens": self.context,
            "tensor_parallel": self.tensor_parallel,
            "bandwidth_gbs_per_gpu": self.bandwidth.gbs,
            "bandwidth_source": self.bandwidth.source,
            "weight_gb_per_token": round(self.weight_bytes / GB, 3),
            "weight_gb_per_rank": round(self.weight_bytes_per_rank / GB, 3),
            "weight_bytes_from": self.weight_method,
            "kv_gb_per_rank": round(self.kv_bytes_per_rank / GB, 4),
        }


@dataclass(frozen=True)
class SpecRoofline:
    """The roofline at the plan's speculative depth."""

    tok_s: float
    method: str
    draft_tokens: int
    accepted_per_pass: float
    acceptance_from: str  # the source, or "ceiling: every draft accepted"
    draft_cost: str  # what a pass's draft reads were counted as

    def as_dict(self) -> dict[str, Any]:
        return {
            "decode_tok_s": round(self.tok_s, 1),
            "method": self.method,
            "draft_tokens": self.draft_tokens,
            "tokens_per_pass": round(1 + self.accepted_per_pass, 2),
            "accepted_per_pass": round(self.accepted_per_pass, 2),
            "acceptance_from": self.acceptance_from,
            "draft_cost": self.draft_cost,
        }


@functools.cache
def _bandwidth_table() -> tuple[tuple[re.Pattern[str], GpuBandwidth | None], ...]:
    text = resources.files("sm120.data").joinpath("gpus.yaml").read_text(encoding="utf-8")
    rows = []
    for item in load_yaml(text):
        figure = item.get("memory_bandwidth_gbs")
        bandwidth = GpuBandwidth(float(figure), item["bandwidth_source"]) if figure else None
        rows.append((re.compile(item["match"], re.IGNORECASE), bandwidth))
    return tuple(rows)


def gpu_bandwidth(gpu_model: str) -> GpuBandwidth | None:
    """The first gpus.yaml entry matching the name decides, as for compute capability."""
    for pattern, bandwidth in _bandwidth_table():
        if pattern.search(gpu_model):
            return bandwidth
    return None


def unread_weight_bytes(dims: PlannerDims, quantization: str) -> float:
    """Resident bytes one decoded token does not read: unpicked routed experts, and all
    embedding rows but its own."""
    d = dims.dims
    unread = 0.0
    if d.vocab_size and d.hidden_size:
        unread += d.vocab_size * d.hidden_size * _ACTIVATION_BYTES[d.dtype]
    if d.n_routed_experts and d.num_experts_per_tok:
        if d.hidden_size is None or d.moe_intermediate_size is None:
            raise PlanError(
                "model.dims names experts but not hidden_size and moe_intermediate_size",
                "copy both from the checkpoint's config.json into model.dims",
            )
        per_byte = EXPERT_BYTES.get(quantization.lower())
        if per_byte is None:
            raise PlanError(
                f"quantization '{quantization}' has no bytes-per-parameter figure",
                f"use one of {', '.join(sorted(EXPERT_BYTES))}",
            )
        moe_layers = d.num_hidden_layers - d.first_k_dense_replace
        unpicked = d.n_routed_experts - d.num_experts_per_tok
        expert_params = GATED_PROJECTIONS * d.hidden_size * d.moe_intermediate_size
        unread += moe_layers * unpicked * expert_params * per_byte
        # the MTP layers' experts: only a draft step runs them, never the target's pass
        unread += d.num_nextn_predict_layers * d.n_routed_experts * expert_params * per_byte
    return unread


def picked_expert_bytes(dims: PlannerDims, quantization: str) -> float:
    """The routed experts one token does read: a floor for the bytes it reads."""
    d = dims.dims
    if not (d.n_routed_experts and d.num_experts_per_tok and d.hidden_size):
        return 0.0
    expert_params = GATED_PROJECTIONS * d.hidden_size * (d.moe_intermediate_size or 0)
    moe_layers = d.num_hidden_layers - d.first_k_dense_replace
    return moe_layers * d.num_experts_per_tok * expert_params * EXPERT_BYTES[quantization.lower()]


def decode_roofline(plan: LaunchPlan, context: int = ROOFLINE_CONTEXT_TOKENS) -> Roofline:
    """The roofline of `plan` at `context` tokens; PlanError says what is missing."""
    gpu_model = plan.hardware.gpu_model
    if not gpu_model:
        raise PlanError("the recipe names no hardware.gpu_model", "add it, e.g. RTX PRO 6000")
    bandwidth = gpu_bandwidth(gpu_model)
    if bandwidth is None:
        raise PlanError(
            f"no memory bandwidth is known for '{gpu_model}'",
            "add memory_bandwidth_gbs with its source to sm120/data/gpus.yaml",
        )
    model = plan.model
    dims = load_dims(model.dims, model.weights_gib, None, model.repo, model.architecture)
    tp, dcp = planned_layout(plan)
    counted = _counted_bytes(dims, plan.model.quantization)
    if counted is not None:
        weight_bytes, per_rank, method = counted.total, counted.per_rank(tp), "config"
        draft_step = counted.draft_step
    else:
        weight_bytes = _resident_read_bytes(dims, plan.model.quantization)
        per_rank, method = weight_bytes / tp, "resident"
        draft_step = _resident_draft_step(dims, weight_bytes)
    layout = layout_for(build_spec(plan, dims, tp, None, None, None), tp, dcp)
    # Only the tokens stored are read: block padding and the prefill-chunk room of window
    # caches are allocation, and a window cache holds at most its window.
    kv_bytes = layout.bytes_per_block * context // (layout.block_size * dcp)
    seconds = (per_rank + kv_bytes) / (bandwidth.gbs * GB)
    return Roofline(
        tok_s=1 / seconds,
        context=context,
        tensor_parallel=tp,
        bandwidth=bandwidth,
        weight_bytes=weight_bytes,
        kv_bytes_per_rank=kv_bytes,
        weight_bytes_per_rank=per_rank,
        weight_method=method,
        draft_step_bytes=draft_step,
    )


def _counted_bytes(dims: PlannerDims, quantization: str) -> ActiveBytes | None:
    per_byte = EXPERT_BYTES.get(quantization.lower())
    return None if per_byte is None else active_weight_bytes(dims, per_byte)


def _resident_read_bytes(dims: PlannerDims, quantization: str) -> float:
    if dims.weights_gib is None:
        raise PlanError("the recipe has no model.weights_gib", "add the engine's resident size")
    weight_bytes = dims.weights_gib * GIB - unread_weight_bytes(dims, quantization)
    picked = picked_expert_bytes(dims, quantization)
    if weight_bytes < picked:
        raise PlanError(
            f"model.weights_gib ({dims.weights_gib:g} GiB) is smaller than the routed experts "
            f"model.dims and quantization '{quantization}' describe",
            "check weights_gib against the engine's 'Model loading took' line",
        )
    return weight_bytes


def _resident_draft_step(dims: PlannerDims, weight_bytes: float) -> float:
    """Without the config's shape, one MTP step reads one layer's share of the token's
    bytes plus the LM head (when its size is known)."""
    d = dims.dims
    lm_head = (d.vocab_size or 0) * (d.hidden_size or 0) * _ACTIVATION_BYTES[d.dtype]
    return (weight_bytes - lm_head) / d.num_hidden_layers + lm_head


def speculative_roofline(plan: LaunchPlan, roofline: Roofline) -> SpecRoofline | None:
    """The roofline at the plan's speculative depth, or None without speculative decoding."""
    speculative = plan.speculative
    if speculative is None:
        return None
    drafts = speculative.num_speculative_tokens
    acceptance = plan.published.acceptance if plan.published else None
    if acceptance is not None:
        accepted = min(acceptance.accepted_per_pass, float(drafts))
        source = acceptance.source
    else:
        accepted, source = float(drafts), "ceiling: every draft accepted (no published figure)"
    tp = roofline.tensor_parallel
    if speculative.method in MTP_METHODS and roofline.draft_step_bytes is not None:
        draft = drafts * roofline.draft_step_bytes / tp
        cost = f"{drafts} MTP steps x {roofline.draft_step_bytes / GB:.2f} GB (one layer + LM head)"
    elif speculative.method in FREE_DRAFT_METHODS:
        draft, cost = 0.0, "prompt lookup: no weight reads"
    else:
        draft, cost = 0.0, f"the {speculative.method} drafter's reads are not counted (a bound)"
    seconds = (roofline.weight_bytes_per_rank + draft + roofline.kv_bytes_per_rank) / (
        roofline.bandwidth.gbs * GB
    )
    return SpecRoofline(
        tok_s=(1 + accepted) / seconds,
        method=speculative.method,
        draft_tokens=drafts,
        accepted_per_pass=accepted,
        acceptance_from=source,
        draft_cost=cost,
    )


def roofline_or_reason(plan: LaunchPlan) -> tuple[Roofline | None, str | None]:
    """For views: the roofline, or why there is none (one line)."""
    tp, dcp = planned_layout(plan)
    if tp < 1 or dcp < 1:
        # Rule S04 refuses such a plan; a view of it (a dry run, --force S04) says why
        # there is no figure rather than dividing by the count.
        return None, f"a parallel size below 1 (tensor {tp}, decode context {dcp})"
    try:
        return decode_roofline(plan), None
    except PlanError as error:
        return None, error.one_line()
