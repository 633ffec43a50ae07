"""Every command resolves its plan from the same layers (sm120.plan.request): a variant
chosen in the environment (SM120_VARIANT) or in ./.env reaches `build`, `compose`,
`launch --dry-run` and `recipes show` alike, so they name one image tag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.helpers import invoke

# dsv4's seed variant keeps the image of the recipe's first stack (the default moved to the
# gated FlashInfer decode build), so choosing the variant changes the tag.
RECIPE, VARIANT = "dsv4", "seed"


def _build_tag(cli: CliRunner) -> str:
    code, out, err = invoke(cli, "build", RECIPE, "--dry-run", "--json")
    assert code == 0, err
    return str(json.loads(out)["tag"])


def _compose_image(cli: CliRunner) -> str:
    code, out, err = invoke(cli, "compose", RECIPE)
    assert code == 0, err
    return str(yaml.safe_load(out)["services"]["server"]["image"])


def _launch_image(cli: CliRunner) -> str:
    code, out, err = invoke(cli, "launch", RECIPE, "--dry-run", "--json", "--gpus", "4")
    assert code in (0, 1), err  # 1: a rule fails on this hardware; the plan is printed anyway
    return str(json.loads(out)["image"])


def _show_image(cli: CliRunner) -> str:
    code, out, err = invoke(cli, "recipes", "show", RECIPE, "--json")
    assert code == 0, err
    return str(json.loads(out)["image"])


def _images(cli: CliRunner) -> dict[str, str]:
    return {
        "build": _build_tag(cli),
        "compose": _compose_image(cli),
        "launch": _launch_image(cli),
        "recipes show": _show_image(cli),
    }


@pytest.mark.parametrize("layer", ["environment", ".env"])
def test_build_compose_launch_and_show_name_one_image(
    cli: CliRunner, layer: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    default = _images(cli)
    assert len(set(default.values())) == 1, default
    if layer == "environment":
        monkeypatch.setenv("SM120_VARIANT", VARIANT)
    else:
        (tmp_path / ".env").write_text(f"VARIANT={VARIANT}\n")  # the tests run in tmp_path
    chosen = _images(cli)
    assert len(set(chosen.values())) == 1, chosen
    # The setting was read at all: the variant's own image, not the default one.
    assert chosen["build"] != default["build"]
    assert chosen["build"].startswith(f"sm120/{RECIPE}:")
