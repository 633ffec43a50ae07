"""The search space a recipe declares: every knob and value checked before anything runs,
with the exact one-line messages a user sees."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from sm120.plan.resolve import PlanRequest, resolve
from sm120.recipe.loader import load_recipe, recipe_from_data
from sm120.recipe.schema import Recipe
from sm120.tune.space import Candidate, TuneError, build_space, candidate_request
from tests.helpers import REPO


def tiny_with(tune: dict[str, Any]) -> Recipe:
    data = yaml.safe_load((REPO / "recipes" / "tiny.yaml").read_text())
    data["tune"] = tune
    return recipe_from_data(data, "tiny.yaml")


def space_error(tune: dict[str, Any], sets: tuple[str, ...] = ()) -> str:
    recipe = tiny_with(tune)
    base = PlanRequest(recipe="tiny", sets=sets)
    with pytest.raises(TuneError) as caught:
        build_space(recipe, base, resolve(base, recipe))
    return caught.value.one_line()


def test_a_knob_the_engine_does_not_have_is_refused_with_a_suggestion() -> None:
    assert space_error({"knobs": {"max-num-seqz": [4, 8]}}) == (
        "tune knob 'max-num-seqz' is not a vllm flag; did you mean 'max-num-seqs'? (hint: "
        "knobs are --set keys: a vllm flag without dashes (sm120/data/engine_flags.yaml) or "
        "a recipe key such as env.NCCL_P2P_DISABLE)"
    )


def test_a_range_the_planner_refuses_names_the_rule() -> None:
    tune = {"knobs": {"gpu-memory-utilization": {"min": 0.8, "max": 1.2, "step": 0.2}}}
    assert space_error(tune) == (
        "tune knob gpu-memory-utilization=1.2: the planner refuses it: S05: "
        "gpu-memory-utilization must be in (0, 1], got 1.2; the seeds use 0.80-0.95 "
        "(hint: narrow the knob's values in the recipe's tune: block)"
    )


def test_a_value_below_the_flag_minimum_is_refused() -> None:
    assert space_error({"knobs": {"max-num-seqs": [0, 4]}}) == (
        "tune knob max-num-seqs=0: the planner refuses it: S04: max-num-seqs must be at "
        "least 1, got 0 (hint: narrow the knob's values in the recipe's tune: block)"
    )


def test_a_knob_sm120_sets_itself_is_refused() -> None:
    assert space_error({"knobs": {"port": [8000, 8001]}}) == (
        "tune knob 'port' is set by sm120 itself and cannot be tuned "
        "(hint: drop it from the recipe's tune: block)"
    )


def test_a_knob_also_fixed_on_the_command_line_is_refused() -> None:
    message = space_error({"knobs": {"max-num-seqs": [4, 8]}}, sets=("max-num-seqs=2",))
    assert message == (
        "tune knob 'max-num-seqs' is also fixed by --set max-num-seqs "
        "(hint: drop the --set, or the knob from the recipe's tune: block)"
    )


def test_an_unknown_variant_is_refused() -> None:
    assert space_error({"variants": ["gpus"]}) == (
        "tune: variant 'gpus' is not a variant of 'tiny'; did you mean 'gpu'? "
        "(hint: variants: 2node, gpu)"
    )


def test_a_recipe_without_a_block_says_so() -> None:
    data = yaml.safe_load((REPO / "recipes" / "tiny.yaml").read_text())
    data.pop("tune")
    recipe = recipe_from_data(data, "tiny.yaml")
    base = PlanRequest(recipe="tiny")
    with pytest.raises(TuneError, match="recipe 'tiny' declares no tune: block"):
        build_space(recipe, base, resolve(base, recipe))


def test_a_range_expands_and_the_default_is_not_an_alternative() -> None:
    recipe = tiny_with({"knobs": {"max-num-seqs": {"min": 2, "max": 16, "factor": 2}}})
    base = PlanRequest(recipe="tiny")
    space = build_space(recipe, base, resolve(base, recipe))
    (knob,) = space.knobs
    assert knob.values == (2, 4, 8, 16)
    assert knob.default == 4  # the recipe's own value
    assert knob.alternatives() == (2, 8, 16)
    assert space.size == 4


def test_the_gpu_variant_declares_three_knobs() -> None:
    recipe = load_recipe("tiny")
    base = PlanRequest(recipe="tiny", variants=("gpu",))
    space = build_space(recipe, base, resolve(base, recipe))
    assert [k.name for k in space.knobs] == [
        "max-num-seqs",
        "max-num-batched-tokens",
        "max-cudagraph-capture-size",
    ]


def test_a_candidate_is_the_tuned_layer_under_the_command_line() -> None:
    base = PlanRequest(recipe="tiny", sets=("max-model-len=512",))
    candidate = Candidate().with_setting("max-num-seqs", 8)
    plan = resolve(candidate_request(base, candidate))
    assert plan.arg("max-num-seqs") == 8
    assert plan.provenance["args.max-num-seqs"] == "tuned"
    assert plan.arg("max-model-len") == 512
    assert candidate.label == "max-num-seqs=8"
    assert Candidate().label == "default"
