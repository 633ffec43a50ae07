"""Speculative decoding as a recipe field: rendered into vLLM's --speculative-config, checked
however it is set (field, args, --set), and carried to the monitor and bench."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sm120.core.errors import RecipeError
from sm120.deploy.monitoring import settings_from_plan
from sm120.plan.resolve import PlanRequest, resolve
from sm120.recipe.loader import recipe_from_data
from sm120.recipe.schema import Speculative
from sm120.render.argv import render_argv
from tests.helpers import REPO, flag_value, invoke, one_line_error

RECIPES = REPO / "recipes"


def recipe_data(name: str) -> dict[str, Any]:
    return yaml.safe_load((RECIPES / f"{name}.yaml").read_text())


def spec_flag(recipe_dict: dict[str, Any], *variants: str) -> Any:
    recipe = recipe_from_data(copy.deepcopy(recipe_dict), "test")
    plan = resolve(PlanRequest(recipe=recipe.name, variants=variants), recipe)
    value = flag_value(render_argv(plan), "--speculative-config")
    return None if value is None else json.loads(value)


def test_config_keys_follow_vllm() -> None:
    drafter = Speculative(
        method="draft_model",
        model="org/small-drafter",
        num_speculative_tokens=4,
        options={"draft_tensor_parallel_size": 1},
    )
    assert list(drafter.config().items()) == [
        ("method", "draft_model"),
        ("model", "org/small-drafter"),
        ("num_speculative_tokens", 4),
        ("draft_tensor_parallel_size", 1),
    ]


def test_the_field_renders_what_the_args_form_renders() -> None:
    # on dsv4's former default (pr41834), which states MTP 2 in its args
    data = recipe_data("dsv4")
    as_args = spec_flag(data, "pr41834")
    former = data["variants"]["pr41834"]
    former["args"].pop("speculative-config")
    former["speculative"] = {"method": "mtp", "num_speculative_tokens": 2}
    assert spec_flag(data, "pr41834") == as_args == {"method": "mtp", "num_speculative_tokens": 2}


def test_a_variant_switches_the_method() -> None:
    data = recipe_data("dsv4")
    data["variants"]["dspark"] = {
        "description": "DSpark, 5 draft tokens",
        "extends": "pr41834",
        "speculative": {"method": "dspark", "num_speculative_tokens": 5},
    }
    assert spec_flag(data, "dspark") == {"method": "dspark", "num_speculative_tokens": 5}
    plan = resolve(PlanRequest(recipe="dsv4", variants=("dspark",)), recipe_from_data(data, "test"))
    assert plan.provenance["args.speculative-config"] == "variant dspark"
    assert plan.published is None  # the default's figures were not measured with DSpark


def test_fork_keys_stay_in_options() -> None:
    plan = resolve(PlanRequest(recipe="glm52"))
    assert plan.speculative == Speculative(
        method="mtp",
        num_speculative_tokens=3,
        options={"moe_backend": "b12x", "draft_sample_method": "probabilistic"},
    )
    assert resolve(PlanRequest(recipe="dsv4", variants=("sglang",))).speculative is None


def test_field_and_args_together_are_refused() -> None:
    data = recipe_data("dsv4")
    data["speculative"] = {"method": "mtp", "num_speculative_tokens": 2}
    with pytest.raises(RecipeError) as caught:
        recipe_from_data(data, "dsv4.yaml")
    assert caught.value.one_line() == (
        "dsv4.yaml: set speculative or args.speculative-config, not both "
        "(hint: fix the value in the recipe)"
    )


def test_a_drafter_method_needs_its_checkpoint() -> None:
    data = recipe_data("tiny")
    data["speculative"] = {"method": "eagle3", "num_speculative_tokens": 3}
    with pytest.raises(RecipeError) as caught:
        recipe_from_data(data, "tiny.yaml")
    assert caught.value.one_line() == (
        "tiny.yaml: speculative: method eagle3 needs the draft checkpoint in "
        "model (hint: fix the value in the recipe)"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            '{"method":"draft_model","num_speculative_tokens":3}',
            "method draft_model needs the draft checkpoint in model",
        ),
        (
            '{"method":"mtp","num_speculative_tokens":0}',
            "num_speculative_tokens: Input should be greater than 0",
        ),
        (
            '{"method":"deepseek_mtp","num_speculative_tokens":1}',
            "method: Input should be 'mtp', 'dspark', 'draft_model', 'eagle', 'eagle3', "
            "'dflash', 'medusa', 'mlp_speculator', 'ngram', 'ngram_gpu' or 'suffix'",
        ),
    ],
)
def test_a_bad_speculative_config_on_the_command_line(
    cli: CliRunner, value: str, message: str
) -> None:
    code, _, err = invoke(
        cli, "launch", "tiny", "--dry-run", "--set", f"speculative-config={value}"
    )
    assert (code, one_line_error(err)) == (
        2,
        f"Error: speculative-config (command line): {message} (hint: e.g. "
        '{"method": "mtp", "num_speculative_tokens": 2})',
    )


def test_the_monitor_is_told_what_the_plan_drafts() -> None:
    settings = settings_from_plan(resolve(PlanRequest(recipe="glm52")), "docker")
    assert (settings.speculative_method, settings.speculative_tokens) == ("mtp", 3)
    settings = settings_from_plan(resolve(PlanRequest(recipe="glm47")), "docker")
    assert (settings.speculative_method, settings.speculative_tokens) == (None, None)


def test_recipes_show_json_names_the_speculative_decoding(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "recipes", "show", "dsv4", "--json")
    assert code == 0
    assert json.loads(out)["speculative"] == {  # the default's (r7) fixed DSpark K5
        "method": "dspark",
        "num_speculative_tokens": 5,
        "model": None,
        "options": {"draft_sample_method": "probabilistic"},
    }
