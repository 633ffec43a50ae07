"""Fail-fast rules over a resolved plan and the hardware it will run on.

Each rule has a stable id (a failure-catalogue id such as F07, or S.. for sanity), a severity,
and returns the problems it finds as one-line messages that name the fix. A rule is skipped
only by `--force ID`, which the plan records (and hashes), or where its catalogue entry says
the failure does not occur on the plan's engine release (failures.yaml engine_versions: a bug
fixed upstream stops blocking the newer engines, and keeps blocking the old ones).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

from sm120.core.suggest import did_you_mean
from sm120.logs.failures import load_catalogue
from sm120.plan.derive import read_config
from sm120.plan.hardware import Hardware, divisors, spelled
from sm120.plan.positions import ALLOW_LONG, effective_config, position_limit
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.catalogue import choice_error, engine_flags, env_allow_list
from sm120.recipe.kv_tiers import tier_refusal

Severity = Literal["error", "warn"]
Check = Callable[[LaunchPlan, Hardware], Iterator[str]]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    title: str
    check: Check


@dataclass(frozen=True)
class RuleResult:
    id: str
    severity: Severity
    status: Literal["pass", "fail", "warn", "forced"]
    title: str
    messages: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "status": self.status,
            "title": self.title,
            "messages": list(self.messages),
        }


RULES: list[Rule] = []


def rule(rule_id: str, severity: Severity, title: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        RULES.append(Rule(rule_id, severity, title, check))
        return check

    return register


def _int(plan: LaunchPlan, name: str, default: int) -> int:
    value = plan.arg(name, default)
    return value if isinstance(value, int) else default


def _tp(plan: LaunchPlan) -> int:
    return _int(plan, "tensor-parallel-size", 1)


def _kv_dtype(plan: LaunchPlan) -> str:
    return str(plan.arg("kv-cache-dtype") or "auto")


@rule("S01", "error", "tensor parallel size divisible by decode context parallel size")
def _tp_divisible_by_dcp(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    dcp, tp = _int(plan, "decode-context-parallel-size", 1), _tp(plan)
    if tp >= 1 and dcp >= 1 and tp % dcp:
        yield (
            f"tensor-parallel-size {tp} is not divisible by decode-context-parallel-size {dcp}; "
            f"pick a DCP that divides TP ({spelled(divisors(tp))} for TP {tp})"
        )


@rule("S02", "error", "the plan fits the GPUs")
def _fits_gpus(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    needed = _tp(plan) * _int(plan, "pipeline-parallel-size", 1)
    if plan.hardware.gpus == 0:
        return
    if plan.multinode is not None:
        # Each node brings its share; the per-node preflight counts the GPUs of every node.
        needed = plan.multinode.gpus_per_node
    if needed > hw.gpus:
        yield (
            f"TP x PP = {needed} GPUs but {hw.describe()} has {hw.gpus}; lower "
            "tensor-parallel-size or pick a variant for fewer GPUs"
        )


@rule("S03", "error", "port in range")
def _port_range(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if not 1 <= plan.port <= 65535:
        yield f"port {plan.port} is outside 1-65535; use e.g. --port 8000"


# The engines keep lengths and counts in 32-bit integers in places (CUDA kernels, torch
# index tensors): anything above overflows there, or is simply a typo.
INT32_MAX = 2**31 - 1


@rule("S04", "error", "lengths and counts are positive and fit in 32 bits")
def _positive(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    flags = engine_flags(plan.engine).flags
    for name, value in plan.args:
        spec = flags.get(name)
        if spec is None or spec.minimum is None or not isinstance(value, int):
            continue
        highest = INT32_MAX if spec.maximum is None else spec.maximum
        if value < spec.minimum and value not in spec.sentinels:
            yield f"{name} must be at least {spec.minimum}, got {value}"
        elif value > highest:
            shown = (
                str(value) if value < 10**24 else f"{str(value)[:12]}... ({len(str(value))} digits)"
            )
            yield f"{name} must be at most {highest}, got {shown}"


@rule("S05", "error", "memory fraction between 0 and 1")
def _memory_fraction(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    for name in ("gpu-memory-utilization", "mem-fraction-static"):
        value = plan.arg(name)
        if isinstance(value, float) and not 0.0 < value <= 1.0:
            yield f"{name} must be in (0, 1], got {value}; the seeds use 0.80-0.95"


@rule("S06", "error", "hardware the recipe is validated on")
def _validated_hardware(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if hw.source == "assumed":
        return
    if hw.arch not in plan.hardware.compute_caps:
        wanted = ", ".join(plan.hardware.compute_caps)
        yield (
            f"{plan.recipe} is validated on {wanted}, this is {hw.describe()}; "
            "pass --force S06 to try anyway"
        )


@rule("S07", "error", "flag values the engine build knows")
def _known_choices(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    flags = engine_flags(plan.engine)
    for name, value in plan.args:
        spec = flags.flags.get(name)
        if spec is None or spec.choices_key is None or value is None or name == "attention-backend":
            continue
        problem = choice_error(
            spec, str(value), flags.choices(plan.image.flavour, spec.choices_key)
        )
        if problem:
            yield f"{problem} for the {plan.image.flavour} engine build"


@rule("S08", "error", "the CPU build of vLLM has no Ray executor")
def _cpu_ray(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    # vllm/v1/executor/ray_utils.py (0.32): "current platform cpu does not support ray".
    if plan.image.flavour == "cpu" and plan.arg("distributed-executor-backend") == "ray":
        yield (
            "vLLM's CPU build refuses the Ray executor ('current platform cpu does not support "
            "ray'); use the native multi-node executor (multinode.executor=native)"
        )


@rule("S09", "error", "max-model-len within the checkpoint's positions")
def _positions(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    # vLLM checks this only once the weights are loaded (42 s in for the tiny model, a
    # traceback): the same check, from the recipe or the checkpoint's config.json, up front.
    wanted = plan.arg("max-model-len")
    dims = plan.model.dims
    if plan.engine != "vllm" or not isinstance(wanted, int) or wanted <= 0:
        return
    if plan.env_dict.get(ALLOW_LONG) in ("1", "true", "True"):
        return
    checkpoint = read_config(Path(plan.model_dir)) if plan.model_dir else None
    if checkpoint is None and dims is None:
        return
    source = "config.json" if checkpoint is not None else "the recipe's model.dims"
    positions = dims.max_position_embeddings if dims is not None else 0
    overrides = plan.arg("hf-overrides")
    limit = position_limit(
        effective_config(checkpoint, positions, overrides), plan.image.engine_version
    )
    if limit is None or wanted <= limit.tokens:
        return
    stretched = {**(overrides if isinstance(overrides, dict) else {})}
    stretched["max_position_embeddings"] = wanted
    yield (
        f"max-model-len {wanted} is above the checkpoint's {limit.tokens} positions "
        f"({limit.key} in {source}), which vLLM refuses after loading the weights; stretch "
        f"them (RoPE models) with --set 'hf-overrides={json.dumps(stretched)}' or lower "
        "max-model-len"
    )


@rule("F02", "error", "attention backend names are uppercase enum names")
def _attention_backend_name(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    backend = plan.arg("attention-backend")
    if plan.engine != "vllm" or backend is None:
        return
    known = engine_flags("vllm").choices(plan.image.flavour, "attention_backends")
    if str(backend) in known:
        return
    upper = [b for b in known if b.startswith(str(backend).upper())]
    hint = f"; did you mean '{upper[0]}'?" if upper else did_you_mean(str(backend), known)
    yield (
        f"unknown attention backend '{backend}'{hint} vLLM names are uppercase enum names "
        "such as TRITON_ATTN"
    )


# The releases F01 holds for are in failures.yaml (engine_versions), like every version scope.
@rule("F01", "error", "no FlashInfer attention on SM120 with vLLM 0.15")
def _flashinfer_on_sm120(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if plan.engine == "vllm" and hw.is_sm12x and plan.arg("attention-backend") == "FLASHINFER":
        yield (
            "FLASHINFER attention crashes at prefill_wrapper.plan() on SM120 with vLLM 0.15; "
            "use --set attention-backend=TRITON_ATTN"
        )


@rule("F29", "error", "GLM-4.x MoE NVFP4 k/v scales load on this vLLM release")
def _glm4_moe_kv_scale_loader(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if (
        plan.engine == "vllm"
        and plan.model.architecture == "Glm4MoeForCausalLM"
        and plan.model.quantization == "nvfp4"
    ):
        yield (
            f"vLLM {plan.image.engine_version} fails to load this NVFP4 checkpoint's k/v scales "
            "(KVCacheScaleParameter.weight_loader() takes 2 positional arguments but 3 were "
            "given); serve it on the recipe's vLLM 0.15.1 image or one with the loader fix"
        )


def _released(plan: LaunchPlan) -> bool:
    """Whether the image's engine_version is a release number ('0.29.1', 'v0.5.15.post1')
    rather than a branch, fork ref or name-only tag."""
    words = plan.image.engine_version.split()
    try:
        Version(words[-1].removeprefix("v") if words else "")
    except InvalidVersion:
        return False
    return True


# F30, F32 and F33 judge upstream releases only: a fork build ships its own SM12x kernels (the
# reports are against upstream releases), and a name-only tag older than the change cannot be
# told from a newer one. Their log signatures, where they have one, still name the failure.
@rule("F30", "error", "DeepSeek-V4.1 has an SM120 sparse-MLA decode kernel on this engine")
def _dsv41_sparse_mla(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    dsv41 = plan.model.architecture.startswith("DeepseekV41") or "V4.1" in (plan.model.repo or "")
    if plan.engine == "vllm" and hw.is_sm12x and dsv41 and _released(plan):
        yield (
            f"vLLM {plan.image.engine_version} has no {hw.arch} sparse-MLA decode kernel for "
            "DeepSeek-V4.1's shape (64 heads, top-k 1152; vllm#56837): the engine dies in its "
            "warm-up; use an image whose recipe ships SM120 kernels for it, or the dsv4 recipe"
        )


@rule("F31", "error", "DeepSeek-V4-Flash-0731 with DSpark starts under data parallel + EP")
def _dspark_dp_ep(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    speculative = plan.speculative
    if (
        plan.engine == "vllm"
        and "0731" in (plan.model.repo or "")
        and speculative is not None
        and speculative.method == "dspark"
        and _int(plan, "data-parallel-size", 1) > 1
        and plan.arg("enable-expert-parallel") is True
    ):
        yield (
            "DeepSeek-V4-Flash-0731 with DSpark under data parallel + expert parallel fails "
            "its profile run (assert num_tokens_across_dp_cpu[dp_rank] == batchsize; "
            "vllm#56281); use --set data-parallel-size=1 (tensor parallel alone), or MTP"
        )


# MLA-family attention layers keep one latent KV head (vLLM's use_mla), so its GQA limits on
# DCP and KV-head splits do not apply; the KDA hybrids' attention layers are MLA (Kimi) or DSA.
_ONE_KV_HEAD = (
    "mla",
    "mla_sparse_dsa",
    "dsv4_compressed",
    "dsv41_ced",
    "kda_mla_hybrid",
    "kda_dsa_hybrid",
)


# S10 judges upstream releases only, as F30-F33 do: a fork may split heads unevenly (the
# Kimi-K3 image serves 96 heads on TP 9, vLLM PR #843 of local-inference-lab/vllm).
@rule("S10", "error", "attention heads split over tensor and decode context parallel as vLLM needs")
def _heads_split(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    dims = plan.model.dims
    if plan.engine != "vllm" or dims is None or not dims.num_attention_heads or not _released(plan):
        return
    tp, dcp, heads = (
        _tp(plan),
        _int(plan, "decode-context-parallel-size", 1),
        dims.num_attention_heads,
    )
    if tp < 1 or dcp < 1:
        return  # S04 refuses the values themselves
    if heads % tp:
        fits = [size for size in divisors(heads) if size <= max(hw.gpus, tp)]
        yield (
            f"{heads} attention heads are not divisible by tensor-parallel-size {tp}: vLLM "
            f"{plan.image.engine_version} refuses it at startup; use a TP that divides "
            f"{heads} ({spelled(fits)})"
        )
    kv_heads = dims.num_key_value_heads or heads
    grouped = plan.model.attention not in _ONE_KV_HEAD
    # vLLM's attention layers assert this as they are built (glm4_moe.py, deepseek_v2.py)
    if grouped and not heads % tp and (kv_heads % tp if kv_heads >= tp else tp % kv_heads):
        yield (
            f"the model's {kv_heads} KV heads do not split over tensor-parallel-size {tp} "
            f"(vLLM needs one to divide the other): the model fails to load; use a TP that "
            f"divides {heads} and divides or is a multiple of {kv_heads}"
        )
    if dcp > 1 and grouped:
        most = tp // kv_heads
        if dcp > most:
            yield (
                f"decode-context-parallel-size {dcp} needs tensor-parallel-size above the "
                f"model's {kv_heads} KV heads and DCP at most TP / KV heads ({most} at TP {tp}): "
                "vLLM refuses it at startup; set decode-context-parallel-size=1"
            )
        elif (heads // kv_heads) % dcp:
            yield (
                f"the model's {heads // kv_heads} query heads per KV head are not divisible by "
                f"decode-context-parallel-size {dcp}: vLLM refuses it at startup; set "
                "decode-context-parallel-size=1"
            )


_QWEN38_FLASH_NEXT = re.compile(r"Qwen3[._]?8[-_]?Flash[-_]?Next", re.IGNORECASE)


@rule("F35", "error", "custom all-reduce captures into CUDA graphs at TP 2 on this engine")
def _custom_all_reduce_capture(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    model = f"{plan.model.repo or ''} {plan.model.architecture}"
    if (
        plan.engine == "vllm"
        and hw.arch == "sm_120"  # the source's GPUs; GB10 (sm_121) was not reported
        and _tp(plan) == 2
        and _QWEN38_FLASH_NEXT.search(model)
        and plan.arg("disable-custom-all-reduce") is not True
        and plan.arg("enforce-eager") is not True
        and _released(plan)
    ):
        yield (
            f"vLLM {plan.image.engine_version}'s custom all-reduce fails during CUDA graph "
            f"capture at TP 2 on {hw.arch} for Qwen3.8-Flash-Next (rtx6kpro "
            "models/qwen38-flash-next.md); use --set disable-custom-all-reduce=true (NCCL)"
        )


# GB10 is SM121; the RTX PRO 6000D is an SM120 card that only its name tells apart.
_GARBLED_GLM52_GPU = re.compile(r"RTX PRO 6000D\b", re.IGNORECASE)


def _gb10_or_6000d(plan: LaunchPlan, hw: Hardware) -> str | None:
    if hw.arch == "sm_121":
        return "GB10 (sm_121)"
    for name in (*hw.names, plan.hardware.gpu_model or ""):
        if _GARBLED_GLM52_GPU.search(name):
            return "RTX PRO 6000D"
    return None


@rule("F32", "error", "GLM-5.2 NVFP4 answers correctly on this GPU and backend")
def _glm52_nvfp4_garbled(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    gpu = _gb10_or_6000d(plan, hw)
    backend = plan.arg("attention-backend")
    if (
        plan.engine == "vllm"
        and gpu is not None
        and plan.model.architecture == "GlmMoeDsaForCausalLM"
        and plan.model.quantization == "nvfp4"
        and backend in (None, "FLASHINFER_MLA_SPARSE_SM120")
        and _released(plan)
    ):
        yield (
            f"GLM-5.2 NVFP4 on {gpu} through FLASHINFER_MLA_SPARSE_SM120 serves garbled text "
            "(vllm#49886, open): no known fix there; on RTX PRO 6000 use the glm52 recipe's "
            "b12x image with --set attention-backend=B12X_MLA_SPARSE"
        )


@rule("F33", "error", "SGLang's FlashMLA sparse prefill is off for DeepSeek-V4 on SM12x")
def _sglang_flashmla_prefill(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    setting = plan.env_dict.get("SGLANG_OPT_FLASHMLA_SPARSE_PREFILL", "").lower()
    if (
        plan.engine == "sglang"
        and hw.is_sm12x
        and plan.model.attention == "dsv4_compressed"
        and setting not in ("0", "false")
        and _released(plan)
    ):
        yield (
            f"SGLang {plan.image.engine_version} turns FlashMLA sparse prefill on by default "
            f"and it has no {hw.arch} kernel (sglang#31578): set "
            "--set env.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=0"
        )


# The releases F05b holds for are in failures.yaml; `sm120 test agent --full` shows it happen.
@rule("F05b", "warn", "MTP speculative decoding breaks GLM tool calls")
def _mtp_glm_tool_calls(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    speculative = plan.speculative
    parser = str(plan.arg("tool-call-parser") or "")
    if speculative is not None and speculative.method == "mtp" and parser.startswith("glm"):
        yield (
            f"MTP drafts with the {parser} tool parser on vLLM {plan.image.engine_version} "
            "have returned broken or missing tool calls (HTTP 200, nothing logged); for coding "
            "agents drop speculative-config, and check with 'sm120 test agent --full'"
        )


# F40-F43: what coding agents meet on the engine a recipe runs. Each is a warning (a plan
# serving no agent loses nothing); the releases are in failures.yaml, and where the gateway
# absorbs the bug for the build (sm120/data/engine_fixes.yaml) the message says so.
@rule("F40", "warn", "Claude Code's mid-conversation system messages on this vLLM")
def _inline_system_messages(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if plan.engine == "vllm":
        yield (
            f"vLLM {plan.image.engine_version} refuses or renders in place the system messages "
            "Claude Code 2.1.154+ sends mid-conversation, breaking its tool calls (vllm#48874): "
            "serve Claude Code through sm120's gateway, which merges them into the system prompt"
        )


@rule("F41", "warn", "the Anthropic thinking parameter is ignored by this vLLM")
def _thinking_ignored(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if plan.engine == "vllm":
        yield (
            f"vLLM {plan.image.engine_version}'s /v1/messages ignores a client's thinking on/off "
            f"(vllm PR 53058), so replies {'reason' if plan.thinking else 'do not reason'} "
            "whatever Claude Code asks: sm120's gateway maps it to the template's switch on "
            "0.24-0.26; elsewhere set --set thinking=... for the deployment"
        )


@rule("F42", "warn", "Codex's Responses requests on a GLM tool parser")
def _codex_on_glm_parsers(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    parser = str(plan.arg("tool-call-parser") or "")
    if plan.engine == "vllm" and parser.startswith("glm"):
        yield (
            f"Codex's Responses requests with the {parser} tool parser fail conformance cases "
            "and can abort mid-stream when a tool call's arguments meet reasoning (vllm PR "
            "56285, vllm#55284): check with 'sm120 test agent --full' before relying on Codex"
        )


@rule("F43", "warn", "the Responses store keeps every response in the engine's memory")
def _responses_store(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    store = plan.env_dict.get("VLLM_ENABLE_RESPONSES_API_STORE", "0")
    if plan.engine == "vllm" and store not in ("", "0"):
        yield (
            "VLLM_ENABLE_RESPONSES_API_STORE=1 keeps every response in the engine's memory and "
            "never frees one: Codex needs no store (it sends store=false and the whole "
            "conversation); drop it unless a client uses previous_response_id"
        )


@rule("F07", "error", "no nvfp4 KV cache on SM12x")
def _nvfp4_kv(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    # A fork's own 4-bit KV format with SM120 kernels (failures.yaml F07 fork_fixes) holds
    # on that engine ref only; every other build, and every other fp4 dtype, still fails.
    own = load_catalogue()["F07"].fork_fixes.get(plan.image.engine_version, ())
    if hw.is_sm12x and _kv_dtype(plan).startswith("nvfp4") and _kv_dtype(plan) not in own:
        yield (
            f"kv-cache-dtype {_kv_dtype(plan)} has no {hw.arch} kernel (the engine dies on the "
            "first request); use --set kv-cache-dtype=fp8"
        )


@rule("F11", "error", "sparse MLA needs an fp8 KV cache on SM12x")
def _sparse_mla_kv(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    sparse_mla = plan.model.attention == "mla_sparse_dsa" and plan.engine == "vllm"
    own = load_catalogue()["F11"].fork_fixes.get(plan.image.engine_version, ())
    fp8 = _kv_dtype(plan).startswith("fp8")
    if hw.is_sm12x and sparse_mla and not fp8 and _kv_dtype(plan) not in own:
        yield (
            f"kv-cache-dtype {_kv_dtype(plan)} on the SM120 sparse-MLA path produces "
            "garbage output; use --set kv-cache-dtype=fp8 (stored as fp8_ds_mla)"
        )


def _fp4_indexer_requested(plan: LaunchPlan) -> bool:
    config = plan.arg("attention-config")
    if isinstance(config, dict) and config.get("use_fp4_indexer_cache") in (True, "true", "True"):
        return True
    overrides = plan.arg("hf-overrides")
    return isinstance(overrides, dict) and bool(overrides.get("use_fp4_indexer_cache"))


@rule("F13", "error", "no fp4 indexer cache on SM12x")
def _fp4_indexer(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if hw.is_sm12x and _fp4_indexer_requested(plan):
        yield (
            "use_fp4_indexer_cache asserts on SM12x (the DSA fp4 indexer cache is SM100-only); "
            "remove it from attention-config"
        )


@rule("F14", "error", "DeepSeek-V4 needs an fp8 KV cache")
def _dsv4_kv(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    dsv4 = plan.model.attention == "dsv4_compressed" and plan.engine == "vllm"
    # a fork that builds the model with its own KV page (failures.yaml F14 fork_fixes)
    own = load_catalogue()["F14"].fork_fixes.get(plan.image.engine_version, ())
    if dsv4 and _kv_dtype(plan) not in ("fp8", "fp8_e4m3", "fp8_ds_mla", *own):
        yield (
            f"DeepSeek-V4 fails at model construction with kv-cache-dtype {_kv_dtype(plan)}; "
            "its fp8_ds_mla layout needs --set kv-cache-dtype=fp8"
        )


@rule("F17", "error", "only environment variables the image's engine reads")
def _env_allow_list(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    allowed = env_allow_list(plan.engine, plan.image.flavour, tuple(plan.image.env_allow))
    for name, _ in plan.env:
        if name in allowed.invented:
            yield f"{name}: {allowed.invented[name]}; remove it"
        elif name == "VLLM_ATTENTION_BACKEND" or not allowed.allows(name):
            hint = did_you_mean(name, allowed.names)
            yield (
                f"{name} is not read by the {plan.image.flavour} engine build, so it would be "
                f"silently ignored{hint} (add it to the image's env_allow if it is real)"
            )


@rule("F09", "error", "DSA models get an explicit index_topk_pattern")
def _index_pattern(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if plan.model.attention != "mla_sparse_dsa" or plan.engine != "vllm":
        return
    overrides = plan.arg("hf-overrides")
    has_pattern = isinstance(overrides, dict) and overrides.get("index_topk_pattern")
    if not has_pattern and not plan.pending:
        yield (
            "no index_topk_pattern in hf-overrides: vLLM ignores indexer_types and long-context "
            "output turns to garbage; enable derive.index_topk_pattern or pass the pattern"
        )


@rule("F24", "warn", "NVFP4 DeepSeek-V4 leaves less KV room on SM12x")
def _dsv4_nvfp4(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if plan.model.attention == "dsv4_compressed" and plan.model.quantization == "nvfp4":
        yield (
            "NVFP4 weights are ~4 GiB/GPU larger than MXFP4 on SM12x (less KV cache, lower "
            "concurrency); the default MXFP4 checkpoint is the better choice"
        )


@rule("F16", "warn", "CUDA graphs on the DeepSeek-V4 Triton sparse-MLA path")
def _dsv4_cudagraph(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if (
        plan.model.attention == "dsv4_compressed"
        and plan.engine == "vllm"
        and plan.env_dict.get("VLLM_TRITON_MLA_SPARSE_ALLOW_CUDAGRAPH") != "1"
    ):
        yield (
            "without VLLM_TRITON_MLA_SPARSE_ALLOW_CUDAGRAPH=1 that path runs without CUDA "
            "graphs (~5 tok/s decode)"
        )


@rule("F10", "warn", "PCIe-only multi-GPU needs NCCL_P2P_DISABLE=1")
def _pcie_p2p(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if (
        hw.is_sm12x
        and _tp(plan) > 1
        and plan.hardware.interconnect == "pcie"
        and plan.env_dict.get("NCCL_P2P_DISABLE") != "1"
    ):
        yield (
            "TP > 1 over PCIe without NCCL_P2P_DISABLE=1 often hangs at NCCL init on "
            "RTX PRO 6000 boxes (ACS/IOMMU); set env.NCCL_P2P_DISABLE=1 unless P2P is verified"
        )


@rule("K01", "error", "the KV tier's backend runs on this engine build and attention")
def _kv_tier_supported(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    tier = plan.kv_tier
    if tier is None:
        return
    reason = tier_refusal(
        plan.engine,
        plan.image.flavour,
        plan.model.attention,
        tier.backend,
        plan.image.build_args,
        plan.image.engine_version,
    )
    if reason is not None:
        yield (
            f"kv_tier backend {tier.backend} on {plan.engine} {plan.image.engine_version} "
            f"({plan.model.attention} attention): {reason}; drop kv_tier or pick the other "
            "backend (--force K01 tries anyway)"
        )


@rule("F12", "warn", "reasoning needs room in the READY probe")
def _smoke_budget(plan: LaunchPlan, hw: Hardware) -> Iterator[str]:
    if plan.thinking and plan.smoke.max_tokens < 2000:
        yield (
            f"thinking is on and the READY probe allows only {plan.smoke.max_tokens} tokens: "
            "reasoning can use them all and leave content empty; set smoke.max_tokens=2048"
        )


def holds_for_engine(rule_id: str, plan: LaunchPlan) -> bool:
    """Whether the failure a rule guards against occurs on the plan's engine release."""
    entry = load_catalogue().get(rule_id)
    return entry is None or entry.holds_for(plan.engine, plan.image.engine_version)


def evaluate(plan: LaunchPlan, hw: Hardware) -> list[RuleResult]:
    results = []
    for item in RULES:
        messages = tuple(item.check(plan, hw)) if holds_for_engine(item.id, plan) else ()
        if item.id in plan.forced:
            status: Literal["pass", "fail", "warn", "forced"] = "forced"
        elif not messages:
            status = "pass"
        else:
            status = "fail" if item.severity == "error" else "warn"
        results.append(RuleResult(item.id, item.severity, status, item.title, messages))
    return results


# The rules about the values alone, which need no hardware: `plan` refuses what they refuse
# before it does any arithmetic on the values (tensor-parallel-size 0 would divide by zero,
# gpu-memory-utilization 7 would plan seven GPUs' worth of KV cache).
VALUE_RULES = ("S03", "S04", "S05")


def value_problems(plan: LaunchPlan) -> list[str]:
    """What the value rules find in `plan` (none of them forced), as one-line messages."""
    hw = Hardware(gpus=plan.hardware.gpus, arch="", source="assumed")
    return [
        f"{item.id}: {message}"
        for item in RULES
        if item.id in VALUE_RULES and item.id not in plan.forced
        for message in item.check(plan, hw)
    ]


def rule_ids() -> list[str]:
    return [r.id for r in RULES]


def failures(results: list[RuleResult]) -> list[RuleResult]:
    return [r for r in results if r.status == "fail"]
