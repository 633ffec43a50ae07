"""The recipe as written: one pydantic tree, validated once, exported as JSON schema.

Engine flags live in `args` keyed by the engine's own flag name without dashes, so a recipe
reads like the command it stands for; the flag catalogue (sm120/data/engine_flags.yaml)
checks names and values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sm120.core.defaults import DEFAULT_PORT
from sm120.recipe.restart_policy import (
    DEFAULT_RESTART,
    DEFAULT_RESTART_BACKOFF_S,
    RestartPolicyError,
    parse_restart_policy,
    policy_text,
)

# An OCI content digest as registries and `docker buildx imagetools inspect` print it, and a
# git commit in full or abbreviated (git's own minimum abbreviation is 7).
OCI_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
GIT_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")

ArgValue = Annotated[
    str | int | float | bool | dict[str, Any] | list[Any] | None,
    Field(description="A flag value: a scalar, a JSON object (rendered compact), or null to omit."),
]


# Every number of a recipe, written or set with --set, fits in 32 bits: the engines keep
# lengths and counts in int32 in places, and nothing sm120 plans for comes near (2**64 GPUs is
# a typo, and arithmetic on it would overflow a float or run for minutes).
INT32_MAX = 2**31 - 1
# The deepest model a recipe describes: today's largest have under 200 layers. The planner
# walks the layers, so a billion of them would run for minutes.
MAX_LAYERS = 1024
# The biggest machine sm120 plans for (as the CLI's --gpus): a few nodes of 8 GPUs each.
MAX_GPUS = 64


class Strict(BaseModel):
    # No infinity or NaN: they pass every comparison the wrong way and overflow int().
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _numbers_fit_in_32_bits(self) -> Any:
        for name in type(self).model_fields:
            for number in _numbers_in(getattr(self, name)):
                if abs(number) > INT32_MAX:
                    shown = f"{number:.3g}" if isinstance(number, float) else _digits(number)
                    raise ValueError(f"{name} is {shown}; numbers must be below 2**31")
        return self


def _numbers_in(value: object) -> Iterator[int | float]:
    """The numbers of a field: itself, or the items of a tuple or list (not nested models,
    which check their own, nor engine arguments, which rule S04 checks per flag)."""
    items = value if isinstance(value, tuple | list) else (value,)
    for item in items:
        if isinstance(item, int | float) and not isinstance(item, bool):
            yield item


def _digits(number: int) -> str:
    text = str(number)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


class ModelDims(Strict):
    """What `sm120 plan` needs to size the KV cache before anything starts. The architecture
    fields mirror the checkpoint's config.json (which wins when --model-dir has one); the
    engine fields describe how the recipe's image lays the cache out."""

    num_hidden_layers: int = Field(
        gt=0, le=MAX_LAYERS, description="config.json num_hidden_layers."
    )
    num_attention_heads: int | None = Field(
        None, gt=0, description="config.json num_attention_heads (TP must divide it)."
    )
    num_key_value_heads: int | None = Field(
        None, gt=0, description="config.json num_key_value_heads (full attention)."
    )
    head_dim: int | None = Field(
        None, gt=0, description="config.json head_dim: per-head size of K and V."
    )
    kv_lora_rank: int | None = Field(
        None, gt=0, description="config.json kv_lora_rank: the MLA latent width."
    )
    qk_rope_head_dim: int | None = Field(
        None, ge=0, description="config.json qk_rope_head_dim: the MLA rotary part (GLM-5.3: 0)."
    )
    index_head_dim: int | None = Field(
        None, gt=0, description="config.json index_head_dim: the sparse-attention indexer key."
    )
    index_topk_freq: int | None = Field(
        None, gt=0, description="config.json index_topk_freq: every Nth layer runs the indexer."
    )
    index_skip_topk_offset: int | None = Field(
        None, ge=0, description="config.json index_skip_topk_offset (vLLM's default is 2)."
    )
    compress_ratios: tuple[int, ...] | None = Field(
        None, description="config.json compress_ratios (DeepSeek-V4): 0, 4 or 128 per layer."
    )
    sliding_window: int | None = Field(
        None, gt=0, description="config.json sliding_window (DeepSeek-V4 local attention)."
    )
    num_nextn_predict_layers: int = Field(
        0, ge=0, description="config.json num_nextn_predict_layers: MTP layers with their own KV."
    )
    max_position_embeddings: int = Field(
        gt=0, description="config.json max_position_embeddings: the engine's default context."
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="Activation dtype; the KV cache uses it unless it is fp8."
    )
    kv_cache_fp8: bool = Field(
        False,
        description="The checkpoint's quantization config stores the KV cache in FP8 "
        "(kv_cache_quant_algo FP8): vLLM then uses 1 byte per element with kv-cache-dtype auto.",
    )
    block_size: int | None = Field(
        None,
        gt=0,
        description="Tokens per KV block the image's engine uses when the recipe passes no "
        "--block-size (16 on CUDA, 64 for sparse MLA, 128 on the CPU build).",
    )
    dsa_indexer_cache: Literal["every_layer", "full_layers"] | None = Field(
        None,
        description="Which layers allocate a sparse-attention indexer K-cache on the image's "
        "engine: the b12x fork builds one on every layer, upstream only on full layers.",
    )
    hidden_size: int | None = Field(
        None, gt=0, description="config.json hidden_size (the decode roofline's expert size)."
    )
    vocab_size: int | None = Field(
        None,
        gt=0,
        description="config.json vocab_size: a token reads one row of the embedding table, "
        "not all of it (the decode roofline).",
    )
    moe_intermediate_size: int | None = Field(
        None, gt=0, description="config.json moe_intermediate_size: one routed expert's width."
    )
    n_routed_experts: int | None = Field(
        None, gt=0, description="config.json n_routed_experts per MoE layer (after any pruning)."
    )
    num_experts_per_tok: int | None = Field(
        None, gt=0, description="config.json num_experts_per_tok: routed experts a token uses."
    )
    first_k_dense_replace: int = Field(
        0, ge=0, description="config.json first_k_dense_replace: leading dense (non-MoE) layers."
    )
    # With these the decode roofline counts the bytes a token reads from the config itself
    # (attention, indexer, picked experts, LM head) instead of from the resident size.
    q_lora_rank: int | None = Field(
        None, gt=0, description="config.json q_lora_rank: the MLA query down-projection width."
    )
    qk_nope_head_dim: int | None = Field(
        None, gt=0, description="config.json qk_nope_head_dim: the MLA non-rotary query/key part."
    )
    v_head_dim: int | None = Field(
        None, gt=0, description="config.json v_head_dim: the MLA value head width."
    )
    intermediate_size: int | None = Field(
        None, gt=0, description="config.json intermediate_size: the dense layers' MLP width."
    )
    n_shared_experts: int = Field(
        0, ge=0, description="config.json n_shared_experts: experts every token passes through."
    )
    index_n_heads: int | None = Field(
        None, gt=0, description="config.json index_n_heads: the sparse-attention indexer's heads."
    )
    # Hybrid linear-attention models: recurrent layers keep a fixed state per sequence.
    linear_attention: Literal["gdn", "kda"] | None = Field(
        None,
        description="Recurrent layer kind: gdn (Gated DeltaNet: Qwen3-Next, Qwen3.8-Flash-Next) "
        "or kda (Kimi Delta Attention: Kimi-Linear, Kimi-K3, GLM-5.3-Flash).",
    )
    linear_layers: int | None = Field(
        None,
        ge=0,
        le=MAX_LAYERS,
        description="How many of num_hidden_layers are recurrent (config.json layer_types or "
        "linear_attn_config.kda_layers); the rest are attention layers with per-token KV.",
    )
    linear_num_key_heads: int | None = Field(
        None,
        gt=0,
        description="config.json linear_num_key_heads (KDA: linear_attn_config.num_heads).",
    )
    linear_num_value_heads: int | None = Field(
        None, gt=0, description="config.json linear_num_value_heads (KDA: num_heads)."
    )
    linear_key_head_dim: int | None = Field(
        None,
        gt=0,
        description="config.json linear_key_head_dim (KDA: linear_attn_config.head_dim).",
    )
    linear_value_head_dim: int | None = Field(
        None, gt=0, description="config.json linear_value_head_dim (KDA: head_dim)."
    )
    linear_conv_kernel_dim: int | None = Field(
        None, gt=0, description="config.json linear_conv_kernel_dim (KDA: short_conv_kernel_size)."
    )
    mamba_ssm_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        None,
        description="config.json mamba_ssm_dtype: the recurrent state's dtype when "
        "--mamba-ssm-cache-dtype is auto (else the model dtype).",
    )
    index_compress_ratio: int | None = Field(
        None,
        gt=0,
        description="Tokens per stored indexer key on the attention layers (config.json "
        "indexer_compress_ratio, GLM-5.3's index_kpool); unset: one key per token.",
    )
    kv_source_layer_ids: tuple[int, ...] | None = Field(
        None,
        description="config.json kv_source_layer_ids (DeepSeek-V4.1): the layers that store "
        "compressed KV; the others read a source layer's.",
    )
    index_source_layer_ids: tuple[int, ...] | None = Field(
        None,
        description="config.json index_source_layer_ids (DeepSeek-V4.1): the layers that store "
        "indexer keys.",
    )
    quantized: Literal["experts", "all_linear"] = Field(
        "experts",
        description="Which weights the checkpoint stores at its quantization's width: 'experts' "
        "(routed and shared experts; attention, indexer, dense MLP and LM head stay in the "
        "activation dtype, as ModelOpt's experts-only NVFP4) or 'all_linear' (every linear "
        "layer but the LM head and router).",
    )


class ModelSource(Strict):
    repo: str | None = Field(
        None, description="Hugging Face repo id of the checkpoint; null for a generated model."
    )
    revision: str | None = Field(
        None,
        description="Pinned commit of the repo. Null only when no public source names one "
        "(the recipe table then shows 'unpinned').",
    )
    served_name: str = Field(
        # What clients type and logs, URLs and unit files carry: no spaces, quotes, `;` or
        # control characters, and short (a 100,000-character name once took a minute to show).
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$",
        description="Name clients use in the `model` field of requests (letters, digits and "
        "._:/@+-, at most 128 characters).",
    )
    architecture: str = Field(description="HF architecture class, e.g. GlmMoeDsaForCausalLM.")
    attention: Literal[
        "full",
        "mla",
        "mla_sparse_dsa",
        "dsv4_compressed",
        "dsv41_ced",
        "kda_dsa_hybrid",
        "kda_mla_hybrid",
        "gdn_hybrid",
    ] = Field(
        description="Attention family; rules and the planner depend on it (e.g. F11, F14). "
        "dsv41_ced: DeepSeek-V4.1 (compressed KV on its kv_source_layer_ids, read by the other "
        "layers); kda_dsa_hybrid: GLM-5.3's KDA layers mixed with sparse DSA layers; "
        "kda_mla_hybrid: Kimi-Linear / Kimi-K3 (KDA layers mixed with MLA); gdn_hybrid: "
        "Gated DeltaNet layers mixed with full attention (Qwen3-Next, Qwen3.8-Flash-Next)."
    )
    quantization: str = Field(description="Checkpoint weight format, e.g. nvfp4, mxfp4, fp8, bf16.")
    size_gb: float | None = Field(None, ge=0, description="Size on disk in GB, for disk checks.")
    weights_gib: float | None = Field(
        None,
        gt=0,
        description="Weight memory resident on all GPUs together, in GiB, as the engine "
        "reports it after loading; the planner divides it by the tensor-parallel size.",
    )
    dims: ModelDims | None = Field(
        None, description="Model dimensions for the memory planner (sm120 plan)."
    )
    generated: Literal["tiny"] | None = Field(
        None, description="Made locally by sm120 instead of downloaded (the CPU test model)."
    )


# The OCI distribution spec's reference grammar: an optional registry host[:port], then
# lowercase path components joined by '/', each [a-z0-9] runs separated by '.', '_', '__'
# or dashes. No '..' component, no shell metacharacter, no leading '/'.
IMAGE_NAME = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)
IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_BUILD_ARG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _shown(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:57] + "...")


def build_arg_problem(key: str, value: str) -> str | None:
    """Why KEY=VALUE cannot be a Dockerfile build argument, or None: the name is an ARG
    name, the value one line (a newline would end the ARG and start another instruction's
    worth of text in what the build prints and records)."""
    if not _BUILD_ARG_NAME.fullmatch(key):
        return f"{_shown(key)} is not a build argument name (letters, digits, '_')"
    if _CONTROL.search(value):
        return f"{key}'s value holds a control character (a newline, tab or NUL)"
    if len(value) > PATH_MAX:
        return f"{key}'s value is {len(value):,} characters long; at most {PATH_MAX}"
    return None


class ImageSpec(Strict):
    name: str = Field(
        description="Image repository: the published image for 'pull', the base image the "
        "Dockerfile starts FROM for 'dockerfile' (e.g. vllm/vllm-openai)."
    )
    tag: str = Field(description="Pinned tag; never a moving tag like latest.")
    digest: str | None = Field(
        None,
        description="OCI digest (sha256:<64 hex>) the publisher states for the tag: the "
        "immutable pin, preferred over the tag when pulling and compared by `recipes updates`.",
    )
    build: Literal["pull", "dockerfile"] = Field(
        description="'pull' runs the published image; 'dockerfile' builds images/<context>/ "
        "FROM it and tags the result sm120/<recipe>:<plan-hash>."
    )
    context: str | None = Field(None, description="Build context under images/ for 'dockerfile'.")
    build_args: dict[str, str] = Field(
        default_factory=dict,
        description="Dockerfile build arguments: engine repository, ref and commit, pinned "
        "package versions. BASE_IMAGE is always set from name/tag/digest.",
    )
    python: str = Field("python3", description="Interpreter inside the image that runs the engine.")
    flavour: str = Field(
        description="Engine build family for the flag catalogue (e.g. upstream, b12x, pr41834, "
        "sglang): it decides which backend names and environment variables exist."
    )
    engine_version: str = Field(description="Engine version or ref the image carries.")
    engine_commit: str | None = Field(
        None,
        description="Engine git commit (7-40 hex digits) the image is built from or its tag "
        "encodes: the immutable pin where the publisher states no digest.",
    )
    env_allow: tuple[str, ...] = Field(
        (), description="Extra environment variables this image understands (F17 allow-list)."
    )
    shm_size: str = Field("16gb", description="Container shared memory (NCCL needs plenty).")
    cap_add: tuple[Literal["SYS_PTRACE"], ...] = Field(
        (),
        description="Linux capabilities the container adds to Docker's defaults; only "
        "SYS_PTRACE, for engines whose worker takes another process's CUDA IPC handles "
        "(pidfd_getfd: Operation not permitted without it).",
    )

    def identity(self) -> dict[str, Any]:
        """The spec as plan and image hashes see it: a capability list left empty is left
        out, so every image spec written before the field existed keeps its hashes."""
        return self.model_dump(exclude=set() if self.cap_add else {"cap_add"})

    @field_validator("name")
    @classmethod
    def _image_name(cls, value: str) -> str:
        if not IMAGE_NAME.fullmatch(value):
            raise ValueError(
                f"image name {_shown(value)} is not an image reference: lowercase "
                "[registry/]path/name, e.g. vllm/vllm-openai"
            )
        return value

    @field_validator("tag")
    @classmethod
    def _image_tag(cls, value: str) -> str:
        if not IMAGE_TAG.fullmatch(value):
            raise ValueError(
                f"image tag {_shown(value)} is not a tag: up to 128 letters, digits, '_', "
                "'.' or '-', not starting with '.' or '-'"
            )
        return value

    @field_validator("build_args")
    @classmethod
    def _build_args(cls, value: dict[str, str]) -> dict[str, str]:
        for key, arg in value.items():
            problem = build_arg_problem(key, arg)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("digest")
    @classmethod
    def _oci_digest(cls, value: str | None) -> str | None:
        if value is not None and not OCI_DIGEST.match(value):
            raise ValueError(
                f"'{value}' is not an OCI digest: write sha256: and 64 lowercase hex digits, "
                "as `docker buildx imagetools inspect NAME:TAG` prints it"
            )
        return value

    @field_validator("engine_commit")
    @classmethod
    def _git_commit(cls, value: str | None) -> str | None:
        if value is not None and not GIT_COMMIT.match(value):
            raise ValueError(
                f"'{value}' is not a git commit: write 7 to 40 lowercase hex digits, "
                "e.g. the vllm<commit> part of a b12x tag or `git rev-parse --short=10 TAG`"
            )
        return value

    @property
    def pin(self) -> str | None:
        """The immutable reference this image is pinned to: its digest, else its engine commit."""
        if self.digest:
            return self.digest
        return f"commit {self.engine_commit}" if self.engine_commit else None


class HardwareSpec(Strict):
    compute_caps: tuple[Literal["sm_120", "sm_121", "sm_100", "sm_90", "cpu"], ...] = Field(
        description="Compute capabilities the recipe is validated on."
    )
    gpus: int = Field(ge=0, le=MAX_GPUS, description="Number of GPUs the recipe uses (0 for CPU).")
    gpu_memory_gib: float | None = Field(
        None, gt=0, description="Memory per GPU it was validated with."
    )
    interconnect: Literal["pcie", "nvlink", "network", "none"] = Field(
        "pcie", description="How the GPUs talk; PCIe-only boxes need NCCL_P2P_DISABLE (F10)."
    )
    validated_on: str = Field(description="The machines the settings were proven on, in words.")
    gpu_model: str | None = Field(
        None,
        description="The GPU the recipe targets, as nvidia-smi names it (e.g. RTX PRO 6000); "
        "sm120/data/gpus.yaml gives its memory bandwidth for the decode roofline.",
    )


class Baseline(Strict):
    source: str = Field(description="Where the numbers come from (seed document / report).")
    decode_tps: float | None = Field(None, description="Single-stream decode tokens/s (warm).")
    prefill_tps: float | None = Field(None, description="Prefill tokens/s, see notes for length.")
    kv_pool_tokens: int | None = Field(None, description="KV cache pool the engine reported.")
    max_context: int | None = Field(None, description="Longest context validated.")
    concurrency: float | None = Field(None, description="Max concurrency at max context.")
    notes: str | None = Field(None, description="Conditions of the measurement.")


class PublishedFigure(Strict):
    """One published measurement, with what a reader needs to check it."""

    tok_s: float = Field(gt=0, description="Tokens per second as the source reports them.")
    source: str = Field(
        pattern=r"^https?://\S+$",
        description="A link a user can open (issue, PR, README, benchmark table).",
    )
    hardware: str = Field(description="The machine it was measured on, in words.")
    date: str = Field(
        pattern=r"^\d{4}-\d{2}(-\d{2})?$", description="When it was measured (YYYY-MM[-DD])."
    )
    engine_ref: str = Field(description="Engine version, tag or commit the figure was taken on.")
    notes: str | None = Field(None, description="Conditions: context, speculation, warm or cold.")


class ThroughputFigure(PublishedFigure):
    concurrency: int = Field(
        gt=0, description="Concurrent requests: the highest concurrency the source gives."
    )


class Acceptance(Strict):
    """How many draft tokens a verify pass accepts, as a source measured it."""

    accepted_per_pass: float = Field(
        gt=0,
        description="Mean draft tokens accepted per verify pass (the pass adds one more token "
        "of its own): vLLM's mean acceptance length minus 1, or the rate x draft tokens.",
    )
    source: str = Field(min_length=1, description="Where the figure comes from (link or seed).")
    notes: str | None = Field(None, description="Conditions: prompts, sampling, context.")


class Published(Strict):
    """Published figures of a configuration, each with its source."""

    decode: PublishedFigure = Field(description="Decode tokens/s at one request.")
    prefill: PublishedFigure | None = Field(None, description="Prefill tokens/s.")
    throughput: ThroughputFigure | None = Field(
        None, description="Aggregate output tokens/s at the highest concurrency given."
    )
    acceptance: Acceptance | None = Field(
        None,
        description="Speculative decoding's acceptance behind the decode figure: the "
        "speculative roofline uses it (without it, every draft token counts as accepted).",
    )


# Methods whose drafter is a separate checkpoint: vLLM needs its `model`.
DRAFT_CHECKPOINT_METHODS = ("draft_model", "eagle", "eagle3")


class Speculative(Strict):
    """Speculative decoding, rendered into vLLM's --speculative-config JSON object."""

    method: Literal[
        "mtp",
        "dspark",
        "draft_model",
        "eagle",
        "eagle3",
        "dflash",
        "medusa",
        "mlp_speculator",
        "ngram",
        "ngram_gpu",
        "suffix",
    ] = Field(
        description="vLLM SpeculativeConfig.method: mtp (the checkpoint's next-token layers; "
        "vLLM rewrites the deprecated per-model *_mtp names to it), dspark (DeepSeek's block "
        "drafter, vLLM PR #46995), a separate drafter (draft_model, eagle, eagle3, dflash, "
        "medusa, mlp_speculator) or prompt lookup (ngram, ngram_gpu, suffix)."
    )
    num_speculative_tokens: int = Field(
        gt=0, le=16, description="Draft tokens proposed per step (vLLM: num_speculative_tokens)."
    )
    model: str | None = Field(
        None,
        description="The draft checkpoint (Hugging Face repo id or path); required for "
        "draft_model, eagle and eagle3.",
    )
    options: dict[str, ArgValue] = Field(
        default_factory=dict,
        description="Further SpeculativeConfig keys the image's engine knows, e.g. "
        "draft_sample_method, moe_backend (b12x fork), prompt_lookup_max (ngram).",
    )

    @model_validator(mode="after")
    def _drafter_named(self) -> Speculative:
        if self.method in DRAFT_CHECKPOINT_METHODS and not self.model:
            raise ValueError(f"method {self.method} needs the draft checkpoint in model")
        clash = sorted({"method", "model", "num_speculative_tokens"} & set(self.options))
        if clash:
            raise ValueError(f"set {', '.join(clash)} as fields, not in options")
        return self

    def config(self) -> dict[str, Any]:
        """The --speculative-config object, keys in vLLM's documented order."""
        rendered: dict[str, Any] = {"method": self.method}
        if self.model:
            rendered["model"] = self.model
        rendered["num_speculative_tokens"] = self.num_speculative_tokens
        return {**rendered, **self.options}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Speculative:
        known = {k: config[k] for k in ("method", "model", "num_speculative_tokens") if k in config}
        rest = {k: v for k, v in config.items() if k not in known}
        return cls.model_validate({**known, "options": rest})


# Below this a tier holds too few KV blocks to matter (and 1e-300 renders as a size of 0).
KV_TIER_MIN_GIB = 0.125
# Linux's PATH_MAX and NAME_MAX.
PATH_MAX = 4096
NAME_MAX = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_host_path(path: str, what: str) -> None:
    """A host folder a container mounts: `docker -v` and compose's short syntax split on
    ':', so '/data:/etc' would mount /etc; a path no file system takes is refused here, in
    one line, rather than by the kernel later."""
    if len(path) > PATH_MAX:
        raise ValueError(f"{what} is {len(path):,} characters long; a path has at most {PATH_MAX}")
    if _CONTROL.search(path):
        raise ValueError(f"{what} holds a control character (a newline, tab or NUL)")
    if ":" in path:
        raise ValueError(f"{what} {path!r} holds ':', which a container mount reads as a separator")
    if any(len(part.encode()) > NAME_MAX for part in path.split("/")):
        raise ValueError(f"{what} has a folder name longer than {NAME_MAX} bytes")


class KvTier(Strict):
    """A KV tier beyond the GPU: the engine's own offloading keeps evicted prefix blocks in
    host RAM (and, with LMCache, on a local disk) and loads them back on a revisit instead of
    prefilling them again. Sizes are for the whole server, split evenly over its ranks."""

    backend: Literal["native", "lmcache"] = Field(
        "native",
        description="'native': vLLM's OffloadingConnector (--kv-offloading-backend native "
        "--kv-offloading-size); 'lmcache': LMCache's LMCacheConnectorV1 with its CPU (and "
        "disk) tiers configured by LMCACHE_* variables; the image must ship the lmcache package.",
    )
    cpu_gib: float = Field(
        ge=KV_TIER_MIN_GIB,
        le=4096,
        description="Host RAM for offloaded KV blocks, GiB for the whole server; the engine "
        "pins it (page-locked), so it is taken from the host whether used or not.",
    )
    disk_path: str | None = Field(
        None,
        description="LMCache only: a local folder for a disk tier below the CPU one (an "
        "absolute path; mounted into the container at the same path).",
    )
    disk_gib: float | None = Field(
        None,
        ge=KV_TIER_MIN_GIB,
        description="LMCache only: the disk tier's size in GiB for the whole server.",
    )

    @field_validator("cpu_gib", "disk_gib", mode="before")
    @classmethod
    def _a_size_not_a_flag(cls, value: Any) -> Any:
        # YAML and --set read `true` as a bool, which pydantic would take as 1 GiB.
        if isinstance(value, bool):
            raise ValueError(f"a size in GiB, not {str(value).lower()}")
        return value

    @field_validator("disk_path")
    @classmethod
    def _a_path_a_mount_can_hold(cls, value: str | None) -> str | None:
        if value is not None:
            check_host_path(value, "disk_path")
        return value

    @model_validator(mode="after")
    def _disk_complete(self) -> KvTier:
        if (self.disk_path is None) != (self.disk_gib is None):
            raise ValueError("set disk_path and disk_gib together, or neither")
        if self.disk_path is not None:
            if self.backend != "lmcache":
                raise ValueError(
                    "a disk tier needs backend lmcache: vLLM's native offloading keeps "
                    "blocks in host RAM only"
                )
            if not self.disk_path.startswith("/"):
                raise ValueError(f"disk_path '{self.disk_path}' must be an absolute path")
        return self


class Timeouts(Strict):
    ready_s: int = Field(
        gt=0, description="How long launch waits for READY (load + compile + graph capture)."
    )


class SmokeSpec(Strict):
    max_tokens: int = Field(
        64,
        gt=0,
        description="Token budget of the READY probe; reasoning models need >= 2000 (F12).",
    )


class MonitorSpec(Strict):
    restart_on_wedge: bool = Field(
        False,
        description="Let the monitor's watchdog restart the server when it finds it wedged "
        "(F22), after capturing diagnostics; bounded by max_restarts per restart_window_h (F26). "
        "Off: it only captures diagnostics and alerts.",
    )
    wedge_timeout_s: float = Field(
        120,
        gt=0,
        description="Seconds with requests running and every token counter frozen, outside a "
        "compile or warm-up (F21), before the server counts as wedged.",
    )
    livelock_s: float = Field(
        300,
        gt=0,
        description="Seconds with requests running, every token counter frozen and the GPUs "
        "busy (utilisation >= 90% or power >= 60% of the limit), outside a compile, before the "
        "server counts as livelocked (spinning); restarted like a wedge. Longer than any silent "
        "warm-up.",
    )
    max_restarts: int = Field(
        3, ge=0, description="Watchdog restarts allowed per window; one more wedge gives up."
    )
    restart_window_h: float = Field(
        6.0, gt=0, description="The circuit breaker's window for max_restarts, in hours."
    )
    poll_s: float = Field(
        5.0, gt=0, le=60, description="How often the monitor scrapes /metrics and the log."
    )
    restart: str = Field(
        DEFAULT_RESTART,
        description="What to do when the server dies: 'no' (it stays dead), 'on-failure' "
        "(the monitor relaunches it after a failure, under the same breaker as wedge restarts: "
        "max_restarts per restart_window_h) or 'on-failure:N' (at most N per window). An exit "
        "0 or a SIGTERM/SIGINT/SIGHUP is not a failure. `launch --restart` and .env RESTART "
        "set it too.",
    )
    restart_backoff_s: float = Field(
        DEFAULT_RESTART_BACKOFF_S,
        ge=0,
        le=3600,
        description="Wait before relaunching a server that died again: this long after the "
        "first restart in the window, doubling with each further one (capped at 10 minutes).",
    )

    @field_validator("restart", mode="before")
    @classmethod
    def _known_policy(cls, value: Any) -> str:
        try:
            return str(parse_restart_policy(policy_text(value)))
        except RestartPolicyError as exc:
            raise ValueError(exc.message) from None


class Derivations(Strict):
    index_topk_pattern: bool = Field(
        False,
        description="Derive the DSA index_topk_pattern from config.json and pass it in "
        "--hf-overrides (F09).",
    )


class MultiNode(Strict):
    """How one engine spans several hosts, with the engine's own distributed executor."""

    executor: Literal["native", "ray"] = Field(
        description="'native': vLLM's own multi-node launcher (--nnodes, --node-rank, "
        "--master-addr, --master-port on every node, --headless on the workers); 'ray': a Ray "
        "head and workers, then --distributed-executor-backend ray on the head."
    )
    nodes: int = Field(
        ge=2, description="How many hosts; --nodes must name exactly this many, the head first."
    )
    gpus_per_node: int = Field(
        ge=0, description="GPUs the engine uses on each node (0 on CPU); one rank per GPU."
    )
    tensor_parallel: int = Field(ge=1, description="Tensor-parallel size across all nodes.")
    pipeline_parallel: int = Field(
        1, ge=1, description="Pipeline-parallel size (stages); 1 means no pipeline."
    )
    expert_parallel: int = Field(
        1,
        ge=1,
        description="Expert-parallel size: 1 (off) or equal to tensor_parallel. vLLM spreads "
        "experts over the TP ranks (--enable-expert-parallel); it has no separate EP size.",
    )
    socket_ifname: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.:@-]{1,15}$",
        description="Network interface NCCL and Gloo use between nodes (NCCL_SOCKET_IFNAME, "
        "GLOO_SOCKET_IFNAME). Null: the interface that carries each node's address, if it has "
        "the same name everywhere. Preflight checks it exists, has the address and one MTU.",
    )
    master_port: int = Field(
        29501,
        ge=1,
        le=65535,
        description="TCP port on the head for the torch.distributed rendezvous (native).",
    )
    ray_port: int = Field(
        6379, ge=1, le=65535, description="Port of the Ray head's GCS (ray executor)."
    )
    nccl_version: str | None = Field(
        None,
        description="NCCL version every node must carry, e.g. 2.30.7 (seed 001: a per-node "
        "mismatch hangs the NCCL handshake). Null: the nodes need only agree.",
    )


class LauncherServing(Strict):
    """The environment variables an image's launcher reads for what sm120 decides itself."""

    model: str | None = Field(None, description="Variable naming the checkpoint (repo or path).")
    revision: str | None = Field(None, description="Variable naming the checkpoint revision.")
    served_name: str | None = Field(None, description="Variable naming the served model.")
    host: str | None = Field(None, description="Variable naming the address to bind.")
    port: str | None = Field(None, description="Variable naming the port.")


class Launcher(Strict):
    """A route whose command is the image's own entrypoint, driven by environment knobs: sm120
    runs that command as is and renders the knobs; the engine flags it ends up with are the
    launcher's. The recipe's args then state what the source says those flags are (the
    planner and the rules read them); only the ones in from_args reach the launcher."""

    command: tuple[str, ...] = Field(
        min_length=1, description="The image's entrypoint and its arguments, run as is."
    )
    knobs: dict[str, str] = Field(
        default_factory=dict,
        description="Environment knobs the launcher reads, as the source sets them.",
    )
    from_args: dict[str, str] = Field(
        default_factory=dict,
        description="Knob -> engine flag: the knob is rendered from the plan's value of that "
        "flag, so --set on the flag reaches the launcher.",
    )
    serving: LauncherServing = Field(
        default_factory=LauncherServing,
        description="Knobs for the model, revision, name, address and port sm120 decides.",
    )
    source: str = Field(min_length=1, description="Where the launcher and its knobs are published.")
    expansion: str = Field(
        min_length=1,
        description="What the knobs expand to (the engine command), or why that is not public.",
    )


TuneValue = Annotated[
    str | int | float | bool | dict[str, Any] | None,
    Field(description="One value a knob may take, as `--set KEY=VALUE` would give it."),
]


class TuneRange(Strict):
    """A knob's values from `min` to `max`: each `factor` times the last, or `step` apart."""

    min: float = Field(description="The first value tried.")
    max: float = Field(description="The last value tried (included when the steps reach it).")
    factor: float | None = Field(
        None, gt=1, description="Each value this many times the one before (e.g. 2)."
    )
    step: float | None = Field(None, gt=0, description="Each value this much above the one before.")

    @model_validator(mode="after")
    def _one_way(self) -> TuneRange:
        if (self.factor is None) == (self.step is None):
            raise ValueError("a range takes factor or step, one of them")
        if self.min > self.max:
            raise ValueError(f"a range runs up: min {self.min:g} is above max {self.max:g}")
        return self


class Tune(Strict):
    """What `sm120 tune` may change: each knob is a `--set` key (an engine flag without dashes,
    or a recipe key such as env.NCCL_P2P_DISABLE) with the values to try; speculative depth
    is `speculative-config`, each value a whole config."""

    knobs: dict[str, tuple[TuneValue, ...] | TuneRange] = Field(
        default_factory=dict,
        description="Knob -> the values to try (a list, or a range); the plan's own value is "
        "the default and always measured.",
    )
    variants: tuple[str, ...] = Field(
        (), description="Recipe variants tried as candidates of their own, on top of the default."
    )
    objective: Literal["decode", "aggregate", "ttft", "turn"] = Field(
        "aggregate", description="What `sm120 tune` optimises when --objective is not given."
    )
    workload: str = Field(
        "chat", description="The workload when --workload is not given (chat, agent, long)."
    )
    concurrency: int = Field(
        16, ge=1, le=4096, description="N of the aggregate objective (streams at once)."
    )
    pairs: int = Field(
        3, ge=1, le=100, description="Alternating default/leader measurements at the end."
    )
    side_by_side: bool = Field(
        False,
        description="The default, the leader and one candidate fit on the GPUs together (a "
        "fixed KV pool, weights well under a third of the memory): the search keeps the "
        "default and the leader running and the pairs alternate requests between them instead "
        "of relaunching each.",
    )


class Variant(Strict):
    description: str = Field(description="What the variant changes and when to pick it.")
    engine: Literal["vllm", "sglang"] | None = Field(None, description="Switches the engine.")
    replace_args: bool = Field(
        False, description="Start from empty args instead of the recipe's (engine switches)."
    )
    replace_env: bool = Field(False, description="Start from empty env instead of the recipe's.")
    model: ModelSource | None = Field(None, description="A different checkpoint.")
    image: ImageSpec | None = Field(None, description="A different image.")
    hardware: HardwareSpec | None = Field(None, description="Different validated hardware.")
    args: dict[str, ArgValue] = Field(default_factory=dict, description="Flags set or removed.")
    env: dict[str, str | None] = Field(
        default_factory=dict, description="Variables set, or removed with null."
    )
    why: dict[str, str] = Field(default_factory=dict, description="Why-notes for what it sets.")
    baseline: Baseline | None = Field(None, description="Published numbers for this variant.")
    published: Published | None = Field(
        None, description="Sourced published figures of this variant (replaces the recipe's)."
    )
    thinking: bool | None = Field(None, description="Overrides whether replies reason first.")
    derive: Derivations | None = Field(None, description="Different derivations.")
    smoke: SmokeSpec | None = Field(None, description="Different READY probe budget.")
    multinode: MultiNode | None = Field(
        None, description="Serve across several hosts with this layout (sm120 launch --nodes)."
    )
    speculative: Speculative | None = Field(
        None, description="Speculative decoding for this variant (sets --speculative-config)."
    )
    kv_tier: KvTier | None = Field(
        None, description="A KV tier beyond the GPU for this variant (replaces the recipe's)."
    )
    launcher: Launcher | None = Field(
        None, description="Run the image's own entrypoint with these knobs (replaces the recipe's)."
    )
    tune: Tune | None = Field(
        None, description="What `sm120 tune` searches for this variant (replaces the recipe's)."
    )
    seed: bool = Field(
        False,
        description="This variant is the recipe's seed configuration, the default before a "
        "faster stack replaced it: its plan hash and container labels are those the default "
        "had, so goldens, compose files and servers made before the default moved still match.",
    )
    former_default: bool = Field(
        False,
        description="This variant is a default the recipe had before a faster stack replaced "
        "it (other than the seed configuration): like `seed`, its name is left out of the plan "
        "hash and container labels, so what was made from that default still matches.",
    )


class Recipe(Strict):
    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=64, description="Short name used on the CLI."
    )
    title: str = Field(description="One line: model and what makes the recipe special.")
    sources: tuple[str, ...] = Field(description="Documents the settings come from.")
    engine: Literal["vllm", "sglang"] = Field(description="Serving engine.")
    model: ModelSource = Field(description="The checkpoint.")
    image: ImageSpec = Field(description="Container image that carries the engine and patches.")
    hardware: HardwareSpec = Field(description="Hardware the recipe is validated on.")
    args: dict[str, ArgValue] = Field(
        description="Engine flags without leading dashes, in the order they are rendered."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment of the engine.")
    why: dict[str, str] = Field(
        default_factory=dict,
        description="Why each non-obvious flag or variable is set, naming the failure it prevents.",
    )
    thinking: bool = Field(
        False, description="Whether the model reasons before answering by default."
    )
    derive: Derivations = Field(
        default_factory=Derivations, description="Values read from weights."
    )
    variants: dict[str, Variant] = Field(default_factory=dict, description="Named alternatives.")
    baseline: Baseline | None = Field(None, description="Published performance of the default.")
    published: Published | None = Field(
        None,
        description="Sourced published figures of the default (decode at one request, prefill, "
        "throughput at the highest concurrency), shown beside the decode roofline.",
    )
    timeouts: Timeouts = Field(description="Launch time limits.")
    smoke: SmokeSpec = Field(default_factory=SmokeSpec, description="READY probe settings.")
    monitor: MonitorSpec = Field(
        default_factory=MonitorSpec, description="The monitor and its watchdog."
    )
    default_port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="Port when none is given.")
    multinode: MultiNode | None = Field(
        None,
        description="Multi-node layout of the default; usually set by a variant instead, so the "
        "single-host default stays the default.",
    )
    speculative: Speculative | None = Field(
        None,
        description="Speculative decoding (vLLM): rendered into --speculative-config after the "
        "args; a recipe sets it here or as args.speculative-config, not both.",
    )
    tune: Tune | None = Field(
        None, description="What `sm120 tune` may change, and how it measures (sm120 tune NAME)."
    )
    kv_tier: KvTier | None = Field(
        None,
        description="A KV tier beyond the GPU (host RAM, optionally disk) from the engine's own "
        "offloading; off when absent. `--set kv_tier.cpu_gib=32` or .env KV_TIER_CPU_GIB=32 "
        "turn it on.",
    )
    launcher: Launcher | None = Field(
        None,
        description="The default runs the image's own entrypoint with these knobs instead of "
        "an engine command sm120 builds (usually set by a variant).",
    )

    @model_validator(mode="after")
    def _one_speculative(self) -> Recipe:
        if self.speculative is not None and "speculative-config" in self.args:
            raise ValueError("set speculative or args.speculative-config, not both")
        return self

    @model_validator(mode="after")
    def _one_seed(self) -> Recipe:
        seeds = [name for name, variant in self.variants.items() if variant.seed]
        if len(seeds) > 1:
            raise ValueError(
                f"variants {', '.join(seeds)} are all marked seed; one configuration was the "
                "seed, keep seed: true on that one"
            )
        return self
