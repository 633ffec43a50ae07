"""The plan a relaunch starts from: every recipe's plan, in every variant, survives the trip
through JSON unchanged, and a damaged file is refused in one line."""

from __future__ import annotations

import json

import pytest

from sm120.core.errors import PlanError
from sm120.plan.resolve import LaunchPlan, PlanRequest, resolve
from sm120.plan.stored import plan_from_data, plan_to_data
from sm120.recipe.loader import load_recipe, recipe_names
from sm120.render.argv import render_argv
from sm120.render.environment import render_env


def every_plan() -> list[LaunchPlan]:
    plans = []
    for name in recipe_names():
        plans.append(resolve(PlanRequest(recipe=name)))
        for variant in load_recipe(name).variants:
            try:
                plans.append(resolve(PlanRequest(recipe=name, variants=(variant,))))
            except PlanError:
                continue  # a variant that needs another one first; covered with it
    return plans


def through_json(plan: LaunchPlan) -> LaunchPlan:
    return plan_from_data(json.loads(json.dumps(plan_to_data(plan))))


def test_every_plan_comes_back_equal() -> None:
    plans = every_plan()
    assert len(plans) >= 20
    assert any(plan.multinode is not None for plan in plans)
    for plan in plans:
        again = through_json(plan)
        assert again == plan, plan.recipe
        assert render_argv(again, python="/x/python") == render_argv(plan, python="/x/python")
        assert render_env(again) == render_env(plan)
        assert again.plan_hash == plan.plan_hash


def test_a_changed_value_is_kept_not_re_resolved() -> None:
    plan = resolve(PlanRequest(recipe="tiny", variants=("2node",), sets=("max-model-len=512",)))
    data = plan_to_data(plan)
    assert ["max-model-len", 512] in data["args"]
    assert through_json(plan).arg("max-model-len") == 512


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d.update(format=0), "it is not a plan this sm120 wrote"),
        (lambda d: d.pop("recipe"), "'recipe' is missing"),
        (lambda d: d["timeouts"].update(ready_s=-1), "1 validation error for Timeouts"),
    ],
)
def test_a_damaged_plan_is_refused_in_one_line(damage, message) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(json.dumps(plan_to_data(resolve(PlanRequest(recipe="tiny")))))
    damage(data)
    with pytest.raises(PlanError) as caught:
        plan_from_data(data)
    assert caught.value.one_line() == (
        f"the saved plan is unusable: {message} (hint: launch the deployment again)"
    )
