"""Golden renderings (argv, environment, compose service) for every recipe and main variant.

Refresh after an intended change with: pytest tests/render/test_golden.py --update-golden
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sm120.plan.resolve import PlanRequest, resolve
from sm120.render.argv import render_argv
from sm120.render.compose import render_compose_service
from sm120.render.environment import render_env
from tests.helpers import GOLDEN_DIR, invoke

CASES = [
    ("glm47", ()),
    ("glm47", ("seed",)),
    ("glm47", ("vllm-0.15.1",)),
    ("glm47", ("seed-pinned",)),
    ("glm52", ()),
    ("glm52", ("seed",)),
    ("glm52", ("dcp2",)),
    ("glm52", ("dcp1",)),
    ("glm52", ("no-think",)),
    ("glm52", ("exl3-tp4",)),
    ("glm52", ("nvfp4-tp8",)),
    ("dsv4", ()),
    ("dsv4", ("seed",)),
    ("dsv4", ("tp4",)),
    ("dsv4", ("tp8",)),
    ("dsv4", ("fp8",)),
    ("dsv4", ("nvfp4",)),
    ("dsv4", ("flashinfer-decode",)),
    ("dsv4", ("sglang",)),
    ("dsv4", ("dspark",)),
    ("dsv4", ("nvfp4-kv",)),
    ("dsv4", ("r7",)),
    ("dsv4", ("r7-tp4",)),
    ("dsv41", ()),
    ("dsv41", ("seed",)),
    ("glm53flash", ()),
    ("glm53flash", ("seed",)),
    ("qwen38flash", ()),
    ("qwen38flash", ("seed",)),
    ("qwen38flash", ("tp2-fp8",)),
    ("dsv4vision", ()),
    ("dsv4vision", ("seed",)),
    ("kimik3", ()),
    ("kimik3", ("seed",)),
    ("tiny", ()),
    ("tiny", ("agent",)),
]


def rendering(recipe: str, variants: tuple[str, ...]) -> dict[str, object]:
    plan = resolve(PlanRequest(recipe=recipe, variants=variants))
    return {
        "plan_hash": plan.plan_hash,
        "argv": render_argv(plan),
        "env": render_env(plan),
        "compose_service": render_compose_service(plan),
    }


@pytest.mark.parametrize(("recipe", "variants"), CASES, ids=["-".join((r, *v)) for r, v in CASES])
def test_golden(
    recipe: str,
    variants: tuple[str, ...],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fixed home keeps the generated tiny model's path stable across machines.
    monkeypatch.setenv("SM120_HOME", "/home/user/.local/state/sm120")
    path = GOLDEN_DIR / f"{'--'.join((recipe, *variants))}.json"
    actual = json.dumps(rendering(recipe, variants), indent=2, sort_keys=True) + "\n"
    if request.config.getoption("--update-golden"):
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(actual)
    assert path.is_file(), f"missing {path.name}: run pytest --update-golden"
    assert actual == path.read_text(), f"{path.name} changed: review, then --update-golden"


# The defaults as main rendered them before the defaults moved to faster stacks (commit
# e6974d4): the seed variant must render them byte for byte, plan hash and labels included,
# so servers, compose files and .env IMAGE tags made from the old default still match.
MAIN_DEFAULT_GOLDENS = {
    "glm47": "54180cf4361cd4cb",
    "glm52": "924eac7a9d2e3aeb",
    "dsv4": "f391fc6323636381",
}


@pytest.mark.parametrize("recipe", sorted(MAIN_DEFAULT_GOLDENS))
def test_seed_variant_renders_mains_default_byte_for_byte(
    recipe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SM120_HOME", "/home/user/.local/state/sm120")
    seed = json.dumps(rendering(recipe, ("seed",)), indent=2, sort_keys=True) + "\n"
    main_default = (GOLDEN_DIR / "seed" / f"{recipe}.json").read_text()
    assert seed == main_default
    assert json.loads(main_default)["plan_hash"] == MAIN_DEFAULT_GOLDENS[recipe]


@pytest.mark.parametrize("recipe", sorted(MAIN_DEFAULT_GOLDENS))
def test_seed_variant_plans_as_mains_default(recipe: str, cli: CliRunner) -> None:
    # tests/golden/seed/plan-*.json: `sm120 plan RECIPE --gpus 4 --json` of main at e6974d4
    code, out, err = invoke(cli, "plan", recipe, "-V", "seed", "--gpus", "4", "--json")
    assert code == 0, err
    assert out == (GOLDEN_DIR / "seed" / f"plan-{recipe}.json").read_text()


# Defaults replaced later than e6974d4, as main rendered them the day before they moved
# (tests/golden/former/<recipe>.json): the variant that keeps each must render it byte for
# byte, plan hash and labels included.
FORMER_DEFAULT_GOLDENS = {
    # glm47 until 2026-12 (vLLM 0.15.1 pinned to 1892993bc), before the move to vLLM 0.16.0
    ("glm47", "seed-pinned"): "ccd64ef563fe52a5",
}


@pytest.mark.parametrize(("recipe", "variant"), sorted(FORMER_DEFAULT_GOLDENS))
def test_a_former_default_renders_byte_for_byte(
    recipe: str, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SM120_HOME", "/home/user/.local/state/sm120")
    former = (GOLDEN_DIR / "former" / f"{recipe}.json").read_text()
    assert json.dumps(rendering(recipe, (variant,)), indent=2, sort_keys=True) + "\n" == former
    assert json.loads(former)["plan_hash"] == FORMER_DEFAULT_GOLDENS[(recipe, variant)]
    labels = json.loads(former)["compose_service"]["labels"]
    assert labels["sm120.variants"] == ""  # the variant's name is not in the labels
