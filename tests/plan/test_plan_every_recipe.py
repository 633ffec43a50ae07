"""`sm120 plan` has a KV layout for every recipe and every variant in recipes/ (new files are
picked up as they land): none is refused for want of a KV model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sm120.recipe.loader import load_recipe, recipe_names
from tests.helpers import invoke, plan_for

# KV memory per GPU for recipes whose resident weight size no source gives (dsv41,
# glm53flash, qwen38flash's seed): the plan then sizes only the KV, which is what is checked.
GIVEN_KV_GIB = "20"


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
    args = ["plan", recipe, *chosen, "--gpus", gpus, "--json"]
    if plan.model.weights_gib is None and not plan.arg("kv-cache-memory-bytes"):
        args += ["--kv-memory-gib", GIVEN_KV_GIB]
    code, out, err = invoke(cli, *args)
    assert code in (0, 1), err  # 1: F08, the context does not fit -- still a plan
    document = json.loads(out)
    assert document["kv_bytes_per_token_per_rank"] > 0  # a layout; its pool may not fit (F08)
    assert "no KV model" not in out + err


def test_the_list_covers_the_recipes_that_were_refused() -> None:
    names = {name for name, _ in _cases()}
    assert {"dsv41", "glm53flash", "qwen38flash"} <= names
