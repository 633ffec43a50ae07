"""`sm120 plan` has a KV layout for every recipe and every variant in recipes/ (new files are
picked up as they land): none is refused for want of a KV model or of a weight size."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sm120.plan.fit.active_bytes import EXPERT_BYTES
from sm120.recipe.loader import load_recipe, recipe_names
from tests.helpers import invoke, one_line_error, plan_for

CPU_PLAN_GIB = "8"


def _cases() -> list[tuple[str, str | None]]:
    cases: list[tuple[str, str | None]] = []
    for name in recipe_names():
        cases.append((name, None))
        cases += [(name, variant) for variant in load_recipe(name).variants]
    return cases


@pytest.mark.parametrize(("recipe", "variant"), _cases())
def test_every_recipe_and_variant_gets_a_kv_layout(
    recipe: str, variant: str | None, cli: CliRunner
) -> None:
    chosen = ("-V", variant) if variant else ()
    plan = plan_for(recipe, *((variant,) if variant else ())).plan
    # a multi-node recipe names the GPUs of one node; the planner wants the TP it plans
    gpus = str(max(plan.hardware.gpus, int(plan.arg("tensor-parallel-size", 1) or 1)))
    # no --kv-memory-gib: a recipe that states no weight size has them estimated from its
    # model.dims (test_resident_estimate.py checks the estimate against measured sizes)
    args = ["plan", recipe, *chosen, "--gpus", gpus, "--json"]
    if plan.hardware.gpu_memory_gib is None:
        args += ["--gpu-mem-gib", CPU_PLAN_GIB]  # the CPU build's tiny names no GPU
    stated = plan.model.weights_gib is not None
    if not stated and plan.model.quantization.lower() not in EXPERT_BYTES:
        # a weight format with no bytes-per-parameter figure: the refusal says so, and a
        # given KV size still plans (the set of such recipes is held below)
        code, _, err = invoke(cli, *args)
        assert code == 2
        assert "has no bytes-per-parameter figure to estimate it" in one_line_error(err)
        args += ["--kv-memory-gib", "20"]
    code, out, err = invoke(cli, *args)
    assert code in (0, 1), err  # 1: F08, the context does not fit -- still a plan
    document = json.loads(out)
    assert document["kv_bytes_per_token_per_rank"] > 0  # a layout; its pool may not fit (F08)
    if "--kv-memory-gib" not in args:
        assert document["weights_gib_per_gpu"] > 0
        estimated = document["weights_source"].startswith("estimated from config dims")
        assert estimated is not stated
    assert "no KV model" not in out + err


def test_the_list_covers_the_recipes_that_were_refused() -> None:
    names = {name for name, _ in _cases()}
    assert {"dsv41", "glm53flash", "qwen38flash"} <= names


def test_only_kimi_k3_has_a_weight_format_the_estimate_cannot_size() -> None:
    """Kimi-K3's QSRT-K2 (two-bit trellis-coded experts, MXFP8 dense weights) has no published
    bytes per parameter and no stored source states its resident size; no other recipe may
    join it unnoticed."""
    unsized = {
        name
        for name, variant in _cases()
        if (model := plan_for(name, *((variant,) if variant else ())).plan.model).weights_gib
        is None
        and model.quantization.lower() not in EXPERT_BYTES
    }
    assert unsized <= {"kimik3"}
