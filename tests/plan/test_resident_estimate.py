"""The resident-weight estimate (sm120/plan/fit/resident.py) against sizes that were measured.

Each recipe and variant that states model.weights_gib is estimated as if it did not, from its
own model.dims at its own TP and MTP depth, and the error is held to a band: within 10%
everywhere but GLM-5.2 REAP, whose checkpoint keeps more at high precision than its config
says (explained below). The estimate is then used only where no size is stated.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.plan.fit.dims import GIB, PlannerDims, known_dims, load_dims
from sm120.plan.fit.memory import draft_layers, planned_layout
from sm120.plan.fit.resident import SOURCE, WeightEstimate, estimate_weights
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.loader import load_recipe, recipe_names
from sm120.recipe.schema import ModelDims
from tests.helpers import DATA_DIR, invoke, one_line_error, plan_for

CONFIGS = DATA_DIR / "model_configs"

# Worst error (estimate / stated - 1) each checkpoint may show, with why where it is not 10%.
# This test's own output (pytest -s prints the table): DeepSeek-V4-Flash MXFP4 +2.4%, NVFP4
# +2.4%, FP8 +8.1% (+5.6% without MTP); GLM-4.7 NVFP4 +7.3% (its recipe gives no dense width
# or shared expert; counting every linear layer at NVFP4 would be ~-1%: the checkpoint's
# format is in no stored source); GLM-5.2 REAP below.
DEFAULT_BAND = 0.10
BANDS = {
    # 313 GB on disk (291.5 GiB) against a one-copy count of 265.4 GiB for 466 B parameters
    # (its name says 469 B): the file holds ~26 GiB more than NVFP4 experts and bf16 rest,
    # i.e. some layers stay at higher precision, which config.json does not say. The stated
    # 314.4 is seed 002's "~78.6 GB/GPU resident" x 4 read as GiB: -12.9% at TP 4, -15.8%
    # for the TP 2 variant (read as GB, 292.8 GiB, TP 4 would be -6.5%).
    "0xSero/GLM-5.2-NVFP4-REAP-469B": 0.17,
}


def _stated() -> list[tuple[str, str | None]]:
    cases: list[tuple[str, str | None]] = []
    for name in recipe_names():
        for variant in (None, *load_recipe(name).variants):
            plan = plan_for(name, *((variant,) if variant else ())).plan
            if plan.model.weights_gib is not None:
                cases.append((name, variant))
    return cases


def _planner_dims(plan: LaunchPlan) -> PlannerDims:
    model = plan.model
    return load_dims(model.dims, model.weights_gib, None, model.repo, model.architecture)


def _estimate(plan: LaunchPlan, dims: PlannerDims) -> WeightEstimate:
    estimate = estimate_weights(
        dims, plan.model.attention, plan.model.quantization, draft_layers(plan, dims)
    )
    assert estimate is not None
    return estimate


def _error(plan: LaunchPlan, estimate: WeightEstimate) -> float:
    """Against the stated size, which is the engine's per-GPU figure times the TP."""
    tp, _ = planned_layout(plan)
    assert plan.model.weights_gib is not None
    return estimate.per_gpu_gib(tp) * tp / plan.model.weights_gib - 1


@pytest.mark.parametrize(("recipe", "variant"), _stated())
def test_the_estimate_is_near_every_stated_size(recipe: str, variant: str | None) -> None:
    plan = plan_for(recipe, *((variant,) if variant else ())).plan
    error = _error(plan, _estimate(plan, _planner_dims(plan)))
    band = BANDS.get(plan.model.repo or "", DEFAULT_BAND)
    print(f"{recipe} {variant or '(default)'} {plan.model.quantization}: {error:+.1%}")
    assert abs(error) <= band


def test_the_stated_sizes_cover_each_family_and_format() -> None:
    """The check above is not vacuous: MLA + DSA, full attention, DeepSeek-V4 in three
    formats."""
    seen = set()
    for recipe, variant in _stated():
        plan = plan_for(recipe, *((variant,) if variant else ())).plan
        seen.add((plan.model.attention, plan.model.quantization))
    assert {
        ("mla_sparse_dsa", "nvfp4"),
        ("full", "nvfp4"),
        ("dsv4_compressed", "mxfp4"),
        ("dsv4_compressed", "nvfp4"),
        ("dsv4_compressed", "fp8"),
    } <= seen


@pytest.mark.parametrize(
    ("variant", "expected"), [(None, 0.024), ("nvfp4", 0.024), ("fp8", 0.081), ("sglang", 0.056)]
)
def test_deepseek_v4_is_counted_whole(variant: str | None, expected: float) -> None:
    """290 B parameters with the MTP layer (V4-Flash is a 284 B model, as SGLang's variant
    without MTP counts); the FP8 checkpoint's stated 255.2 GiB is its 274 GB on disk."""
    plan = plan_for("dsv4", *((variant,) if variant else ())).plan
    estimate = _estimate(plan, _planner_dims(plan))
    assert estimate.not_counted == ()
    mtp = draft_layers(plan, _planner_dims(plan))
    assert estimate.params / 1e9 == pytest.approx(290.3 if mtp else 283.8, abs=0.1)
    assert _error(plan, estimate) == pytest.approx(expected, abs=0.002)


# The tiny model's tensors as its real checkpoint stores them (the safetensors header of
# sm120/engine/tiny_model_builder.py's output): norms are the only ones the count leaves out.
TINY_TENSORS = {
    "lm_head": (512, 256),
    "embed_tokens": (512, 256),
    "q_proj": (256, 256),
    "k_proj": (128, 256),
    "v_proj": (128, 256),
    "o_proj": (256, 256),
    "gate_proj": (512, 256),
    "up_proj": (512, 256),
    "down_proj": (256, 512),
}
TINY_LAYERS = 2


def test_the_tiny_model_is_counted_to_the_parameter() -> None:
    per_layer = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    expected = sum(
        rows * cols * (TINY_LAYERS if name in per_layer else 1)
        for name, (rows, cols) in TINY_TENSORS.items()
    )
    plan = plan_for("tiny").plan
    estimate = _estimate(plan, _planner_dims(plan))
    assert estimate.params == expected == 1_441_792
    assert estimate.total_bytes == 2 * expected  # bf16
    assert estimate.not_counted == ()


def _dims(**fields: object) -> PlannerDims:
    base = {"num_hidden_layers": 4, "max_position_embeddings": 4096}
    return PlannerDims(
        dims=ModelDims.model_validate({**base, **fields}),
        source="test",
        weights_gib=None,
        weights_source="recipe",
        indexer_full_layers=None,
    )


def test_no_estimate_without_the_hidden_size_vocabulary_or_mlp() -> None:
    full = {"num_attention_heads": 4, "head_dim": 64, "hidden_size": 256, "vocab_size": 512}
    assert estimate_weights(_dims(**full), "full", "bf16", 0) is None  # no MLP width
    counted = estimate_weights(_dims(**full, intermediate_size=512), "full", "bf16", 0)
    assert counted is not None
    no_vocab = {k: v for k, v in full.items() if k != "vocab_size"}
    assert estimate_weights(_dims(**no_vocab, intermediate_size=512), "full", "bf16", 0) is None
    assert estimate_weights(_dims(**full, intermediate_size=512), "full", "int3", 0) is None


def test_quantized_experts_take_nvfp4_bytes_and_the_rest_bf16() -> None:
    moe = {
        "hidden_size": 1024,
        "vocab_size": 1000,
        "num_attention_heads": 8,
        "head_dim": 128,
        "moe_intermediate_size": 512,
        "n_routed_experts": 16,
    }
    estimate = estimate_weights(_dims(**moe), "full", "nvfp4", 0)
    assert estimate is not None
    experts = 4 * 16 * 3 * 1024 * 512
    attention = 4 * 4 * 1024 * 1024
    embeddings = 2 * 1000 * 1024
    assert estimate.params == experts + attention + embeddings
    assert estimate.total_bytes == experts * (0.5 + 1 / 16) + 2 * (attention + embeddings)
    # with MTP on, its layer (attention and every expert) is resident too
    with_mtp = estimate_weights(_dims(**moe), "full", "nvfp4", 1)
    assert with_mtp is not None
    assert with_mtp.params == estimate.params + (experts + attention) // 4


def test_mla_down_projections_stay_whole_on_every_rank() -> None:
    """vLLM's DeepSeek-family MLA keeps fused_qkv_a_proj on each rank (active_bytes.py)."""
    plan = plan_for("glm52").plan
    estimate = _estimate(plan, _planner_dims(plan))
    assert 0 < estimate.replicated_bytes < estimate.total_bytes
    at_one, at_four = estimate.per_gpu_gib(1), estimate.per_gpu_gib(4)
    assert at_four == pytest.approx(
        (estimate.total_bytes - estimate.replicated_bytes) / 4 / GIB
        + estimate.replicated_bytes / GIB
    )
    assert at_one == pytest.approx(estimate.total_bytes / GIB)


def test_a_part_without_its_shape_is_named_not_guessed() -> None:
    plan = plan_for("glm53flash").plan
    estimate = _estimate(plan, _planner_dims(plan))
    assert estimate.not_counted == (
        "the attention layers (kda_dsa_hybrid: model.dims lacks their shape)",
        "the sparse-attention indexer (index_n_heads, q_lora_rank)",
        "the 3 dense layers' MLP (intermediate_size)",
    )


def document_weights(cli: CliRunner) -> float:
    code, out, err = invoke(cli, "plan", "dsv41", "--gpus", "4", "--json")
    assert code in (0, 1), err
    return float(json.loads(out)["weights_gib_per_gpu"])


def test_the_plan_says_the_size_is_an_estimate(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "plan", "dsv41", "--gpus", "4")
    assert code in (0, 1), err
    text = " ".join(out.replace("│", " ").split())  # the table's cells, unwrapped
    assert f"weights / GPU ~{document_weights(cli):.2f} GiB ({SOURCE})" in text
    code, out, err = invoke(cli, "plan", "dsv41", "--gpus", "4", "--json")
    document = json.loads(out)
    assert document["weights_source"] == SOURCE
    assert document["kv_memory_source"] == "estimated"
    estimate = document["weights_estimate"]
    assert estimate["not_counted"] == []
    assert estimate["total_gib"] == pytest.approx(document["weights_gib_per_gpu"] * 4, rel=0.05)


def test_a_stated_size_is_used_as_before(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "plan", "glm52", "--gpus", "4", "--json")
    assert code in (0, 1), err
    document = json.loads(out)
    assert document["weights_source"] == "recipe"
    assert document["weights_gib_per_gpu"] == pytest.approx(314.4 / 4, abs=0.001)
    assert "weights_estimate" not in document


def test_kv_memory_gib_still_overrides_the_estimate(cli: CliRunner) -> None:
    args = ("plan", "glm53flash", "--gpus", "4", "--json")
    code, out, err = invoke(cli, *args, "--kv-memory-gib", "20")
    assert code in (0, 1), err
    given = json.loads(out)
    code, out, err = invoke(cli, *args)
    estimated = json.loads(out)
    assert given["kv_memory_source"] == "given"
    assert given["kv_memory_gib_per_gpu"] == 20
    assert estimated["kv_memory_source"] == "estimated"
    assert estimated["kv_memory_gib_per_gpu"] != 20
    assert given["kv_pool_tokens"] != estimated["kv_pool_tokens"]


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        (
            "model.quantization=qsrt_k2",
            "quantization 'qsrt_k2' has no bytes-per-parameter figure to estimate it",
        ),
        ("model.dims.vocab_size=null", "model.dims lacks vocab_size to estimate it"),
        (
            "model.dims.n_routed_experts=null",
            "model.dims lacks intermediate_size or n_routed_experts and moe_intermediate_size "
            "to estimate it",
        ),
    ],
)
def test_without_an_estimate_the_plan_says_what_is_missing(
    setting: str, why: str, cli: CliRunner
) -> None:
    code, _, err = invoke(
        cli,
        "plan",
        "qwen38flash",
        "--gpus",
        "1",
        "--set",
        setting,
        "--set",
        "kv-cache-memory-bytes=null",
    )
    assert code == 2
    assert one_line_error(err) == (
        f"Error: the resident weight size is unknown: the recipe has no model.weights_gib and "
        f"{why} (hint: pass --model-dir with the weights, or --kv-memory-gib)"
    )


def test_vision_exp_known_dims_count_as_deepseek_v4_flash() -> None:
    """sm120/data/model_dims.yaml's Vision-Exp text model carries V4-Flash's whole shape (its
    vision tower is not counted: no stored source gives its config)."""
    known = known_dims("deepseek-ai/DeepSeek-V4-Flash-Vision-Exp", "DeepseekV4ForCausalLM")
    assert known is not None
    dims = PlannerDims(known, "known", None, "recipe", None)
    estimate = estimate_weights(dims, "dsv4_compressed", "mxfp4", 1)
    assert estimate is not None and estimate.not_counted == ()
    assert estimate.params / 1e9 == pytest.approx(290.3, abs=0.1)


@pytest.mark.parametrize(
    ("recipe", "config"),
    [
        ("dsv41", "deepseek-v4.1-flash.json"),
        ("glm53flash", "glm-5.3-flash.json"),
        ("qwen38flash", "qwen3.8-flash-next.json"),
    ],
)
def test_the_recipes_count_what_their_config_json_holds(
    recipe: str, config: str, tmp_path: Path
) -> None:
    """A checkpoint folder with only its config.json (no weight files) is estimated from the
    config; the recipes' model.dims copies of the same fields give the same figure."""
    shutil.copy(CONFIGS / config, tmp_path / "config.json")
    plan = plan_for(recipe).plan
    from_config = load_dims(None, None, str(tmp_path))
    assert from_config.weights_gib is None
    counted = [
        estimate_weights(dims, plan.model.attention, plan.model.quantization, 1)
        for dims in (from_config, _planner_dims(plan))
    ]
    assert counted[0] is not None and counted[1] is not None
    assert counted[0].params == counted[1].params
    assert counted[0].not_counted == counted[1].not_counted
