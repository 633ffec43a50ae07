"""A variant written on another (`extends`): applied on its base, in the one resolution order,
and refused in one line when the base is no variant or the bases loop."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.plan.resolve import PlanRequest, resolve
from sm120.recipe.loader import load_recipe
from tests.helpers import REPO, invoke, one_line_error

HINT = " (hint: fix the value in the recipe)"


def _glm52_with(variants: str, tmp_path: Path) -> Path:
    path = tmp_path / "glm52.yaml"
    source = (REPO / "recipes" / "glm52.yaml").read_text()
    path.write_text(source.replace("variants:\n", "variants:\n" + variants, 1))
    return path


@pytest.mark.parametrize(
    ("variants", "message"),
    [
        (
            "  a:\n    description: a\n    extends: nosuch\n",
            "variant a extends 'nosuch', which is no variant",
        ),
        (
            "  a:\n    description: a\n    extends: a\n",
            "variants extend each other in a cycle: a -> a",
        ),
        (
            "  a:\n    description: a\n    extends: b\n"
            "  b:\n    description: b\n    extends: c\n"
            "  c:\n    description: c\n    extends: b\n",
            "variants extend each other in a cycle: b -> c -> b",
        ),
    ],
    ids=["unknown", "itself", "loop"],
)
def test_a_bad_extends_is_one_line(
    variants: str, message: str, cli: CliRunner, tmp_path: Path
) -> None:
    path = _glm52_with(variants, tmp_path)
    code, _, err = invoke(cli, "validate", str(path))
    assert (code, one_line_error(err)) == (2, f"Error: {path}: {message}{HINT}")


def test_a_variant_is_applied_on_the_one_it_extends() -> None:
    # dsv4's tp4 is written on the former default: PR #41834's stack, MTP 2, on 4 GPUs
    plan = resolve(PlanRequest(recipe="dsv4", variants=("tp4",)))
    assert plan.variants == ("tp4",)  # the base does not name the plan
    assert plan.launcher is None
    assert plan.arg("tensor-parallel-size") == 4
    assert plan.arg("speculative-config") == {"method": "mtp", "num_speculative_tokens": 2}
    assert plan.provenance["args.tensor-parallel-size"] == "variant tp4"
    assert plan.provenance["args.speculative-config"] == "variant pr41834"
    # the default's launcher flags are gone with its args, and so is the record of them
    assert "args.load-format" not in plan.provenance


def test_a_shared_base_is_applied_once() -> None:
    # -V tp4 -V nvfp4: applying pr41834 again for nvfp4 would drop tp4's TP 4
    plan = resolve(PlanRequest(recipe="dsv4", variants=("tp4", "nvfp4")))
    assert plan.arg("tensor-parallel-size") == 4
    assert plan.model.repo == "nvidia/DeepSeek-V4-Flash-NVFP4"


def test_every_dsv4_variant_but_the_r7_routes_is_written_on_pr41834() -> None:
    recipe = load_recipe("dsv4")
    bases = {name: variant.extends for name, variant in recipe.variants.items()}
    assert bases.pop("pr41834") is None
    assert (bases.pop("r7"), bases.pop("r7-tp4")) == (None, None)
    assert set(bases.values()) == {"pr41834"}
