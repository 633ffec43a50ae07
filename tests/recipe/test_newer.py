"""`sm120 recipes updates` names newer models of a recipe's family and faster published
figures than its own, from sm120/data/known_newer.yaml (no network for these lines)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sm120.recipe.loader import load_recipe, recipe_names
from sm120.recipe.newer import compare, known_newer, newer_lines, published_by_gpus
from sm120.recipe.schema import Published, PublishedFigure, Recipe
from tests.fakes.loopback_server import LoopbackServer
from tests.helpers import invoke
from tests.images.test_recipe_updates import stand_in  # noqa: F401 - the registry stand-in

R7 = "https://github.com/local-inference-lab/rtx6kpro/blob/master/models/ds4dspark-infernal-invocation-r7.md"
KK = "https://github.com/local-inference-lab/rtx6kpro/blob/master/benchmarks/karmic-kraken-serving.md"
KK_03AB23E = (
    "https://github.com/local-inference-lab/rtx6kpro/blob/"
    "03ab23e51c577b10369c973bc979d923af7bdc8e/benchmarks/karmic-kraken-serving.md"
)


def _every() -> list[Recipe]:
    return [load_recipe(name) for name in recipe_names()]


def test_every_entry_names_recipes_that_exist() -> None:
    names = set(recipe_names())
    for entry in known_newer():
        assert set(entry.family) <= names, entry.model


def test_dsv4_is_told_of_deepseek_v4_1_and_the_faster_0731_figures() -> None:
    lines = newer_lines(compare([load_recipe("dsv4")], _every()))
    assert lines == [
        "dsv4 (known)             newer model: DeepSeek-V4.1-Flash 273.96 tok/s on 4 GPUs "
        "(DSpark K7, DCP 1, Karmic Kraken image (vLLM bb709f4acee, B12X eea3ced11fc1)); "
        f"served by dsv41; {KK} (checked 2026-11-28)",
        # the r7 and r7-tp4 variants publish r7's own 236.46 and 301.24: neither is named
        "dsv4 (known)             newer model: DeepSeek-V4-Flash-Vision-Exp 188.73 tok/s on 2 "
        "GPUs (DSpark K3, TP 2 / DCP 1, images and text, Karmic Kraken image (the page's DS4 "
        f"Vision row)); served by dsv4vision; {KK_03AB23E} (checked 2026-12-01)",
    ]


def test_the_newest_models_are_known_and_served() -> None:
    [kimi] = compare([load_recipe("kimik3")], _every())
    assert (kimi.entry.model, kimi.entry.gpus, kimi.status) == ("Kimi-K3", 9, "served by kimik3")


def test_a_newer_model_a_recipe_serves_says_which() -> None:
    [glm53, glm52] = compare([load_recipe("glm47")], _every())
    assert (glm53.entry.model, glm53.status) == ("GLM-5.3-Flash", "served by glm53flash")
    assert (glm52.entry.model, glm52.status) == ("GLM-5.2", "served by glm52")


def test_a_figure_the_recipe_already_publishes_is_not_named() -> None:
    recipe = load_recipe("dsv4")
    assert published_by_gpus(recipe)[2] == 243  # the nvfp4-kv variant's
    assert published_by_gpus(recipe)[4] == 301.24  # r7-tp4's
    # without those the recipe's best on 2 GPUs is dspark's 205.54, below r7's 236.46
    dropped = ("nvfp4-kv", "r7", "r7-tp4")
    variants = {name: v for name, v in recipe.variants.items() if name not in dropped}
    dsv4 = recipe.model_copy(update={"variants": variants})
    assert published_by_gpus(dsv4)[2] == 205.54
    assert [(n.entry.kind, n.entry.gpus) for n in compare([dsv4], _every())] == [
        ("model", 4),
        ("figure", 2),
        ("figure", 4),
    ]
    figure = PublishedFigure(
        tok_s=236.5,
        source=R7,
        hardware="2x RTX PRO 6000",
        date="2026-08-13",
        engine_ref="infernal-invocation r7",
    )
    faster = dsv4.model_copy(update={"published": Published(decode=figure)})
    kinds = [(n.entry.kind, n.entry.gpus) for n in compare([faster], _every())]
    assert kinds == [("model", 4), ("figure", 4), ("model", 2)]


def test_updates_prints_the_known_lines_after_the_builds(
    stand_in: LoopbackServer,  # noqa: F811
    cli: CliRunner,
) -> None:
    code, out, _ = invoke(cli, "recipes", "updates", "glm52")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].startswith("glm52 (default)          image voipmonitor/vllm:")
    assert [line.split()[1] for line in lines[1:3]] == ["(exl3-tp4)", "(nvfp4-tp8)"]
    assert lines[3].startswith(
        "glm52 (known)            newer model: GLM-5.3-Flash 255.71 tok/s on 4 GPUs"
    )
    code, out, _ = invoke(cli, "recipes", "updates", "glm52", "--json")
    known = [row for row in json.loads(out) if row["source"] == "known"]
    assert known == [
        {
            "recipe": "glm52",
            "source": "known",
            "kind": "model",
            "model": "GLM-5.3-Flash",
            "decode_tok_s": 255.71,
            "gpus": 4,
            "config": "MTP 3, DCP 1, Karmic Kraken image (the page's GLM row)",
            "link": KK,
            "checked": "2026-11-28",
            "status": "served by glm53flash",
        }
    ]


def test_offline_still_exits_2_with_its_one_line(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SM120_REGISTRY_MIRROR", "http://127.0.0.1:9")
    monkeypatch.setenv("SM120_PYPI_URL", "http://127.0.0.1:9")
    code, out, err = invoke(cli, "recipes", "updates", "dsv4")
    assert (code, out) == (2, "")
    assert "offline: no registry or PyPI answered" in err
