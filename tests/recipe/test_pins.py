"""Engine images are pinned by digest or commit, the pins are checked, and only one variant
can be the seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.recipe.loader import load_recipe
from tests.helpers import REPO, invoke, one_line_error

RECIPES = REPO / "recipes"
DIGEST = "sha256:" + "0123456789abcdef" * 4


def _variant_of(recipe: str, text: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{recipe}.yaml"
    path.write_text((RECIPES / f"{recipe}.yaml").read_text().replace("variants:\n", text, 1))
    return path


def _with_image_line(line: str, tmp_path: Path) -> Path:
    path = tmp_path / "glm52.yaml"
    source = (RECIPES / "glm52.yaml").read_text()
    path.write_text(source.replace("  engine_commit: bb6c5b7\n", line, 1))
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '  engine_commit: bb6c5b7\n  digest: "sha256:abc"\n',
            "image.digest: 'sha256:abc' is not an OCI digest: write sha256: and 64 lowercase "
            "hex digits, as `docker buildx imagetools inspect NAME:TAG` prints it",
        ),
        (
            f'  engine_commit: bb6c5b7\n  digest: "{DIGEST.upper()}"\n',
            f"image.digest: '{DIGEST.upper()}' is not an OCI digest",
        ),
        (
            "  engine_commit: black-benediction\n",
            "image.engine_commit: 'black-benediction' is not a git commit: write 7 to 40 "
            "lowercase hex digits, e.g. the vllm<commit> part of a b12x tag or "
            "`git rev-parse --short=10 TAG`",
        ),
        ("  engine_commit: bb6c5\n", "image.engine_commit: 'bb6c5' is not a git commit"),
    ],
)
def test_a_malformed_pin_is_one_line_with_a_hint(
    line: str, message: str, cli: CliRunner, tmp_path: Path
) -> None:
    path = _with_image_line(line, tmp_path)
    code, _, err = invoke(cli, "validate", str(path))
    assert code == 2
    error = one_line_error(err)
    assert error.startswith(f"Error: {path}: {message}")
    assert error.endswith("(hint: fix the value in the recipe)")


def test_a_well_formed_digest_validates(cli: CliRunner, tmp_path: Path) -> None:
    path = _with_image_line(f'  engine_commit: bb6c5b7\n  digest: "{DIGEST}"\n', tmp_path)
    code, out, err = invoke(cli, "validate", str(path))
    assert code == 0, err
    assert "ok  glm52" in out


def test_two_seed_variants_are_refused(cli: CliRunner, tmp_path: Path) -> None:
    extra = "variants:\n  old:\n    description: another seed\n    seed: true\n"
    path = _variant_of("glm52", extra, tmp_path)
    code, _, err = invoke(cli, "validate", str(path))
    assert (code, one_line_error(err)) == (
        2,
        f"Error: {path}: variants old, seed are all marked seed; one configuration was the "
        "seed, keep seed: true on that one (hint: fix the value in the recipe)",
    )


@pytest.mark.parametrize("recipe", ["glm47", "glm52", "dsv4"])
def test_every_gpu_recipe_keeps_its_seed(recipe: str) -> None:
    seeds = [name for name, variant in load_recipe(recipe).variants.items() if variant.seed]
    assert seeds == ["seed"]


@pytest.mark.parametrize(
    ("recipe", "pin"),
    [("glm52", "commit bb6c5b7"), ("dsv4", "commit c766cbc6ff"), ("glm47", "commit 89a77b108")],
)
def test_the_pin_is_the_digest_else_the_engine_commit(recipe: str, pin: str | None) -> None:
    assert load_recipe(recipe).image.pin == pin


def test_recipes_show_names_the_pin(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "recipes", "show", "glm52", "--json")
    assert code == 0, err
    assert json.loads(out)["image_pin"] == "commit bb6c5b7"
    code, out, _ = invoke(cli, "recipes", "show", "glm52")
    assert "pinned to commit bb6c5b7" in " ".join(out.split())
    code, out, _ = invoke(cli, "recipes", "show", "glm47", "-V", "seed")
    assert "not pinned: tag only" in " ".join(out.split())
