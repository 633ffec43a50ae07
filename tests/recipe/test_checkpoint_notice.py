"""A variant that serves another checkpoint says so in `recipes show`, and its default does not."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.helpers import invoke

# (recipe, variant, the checkpoint it serves, the default's)
OTHER_CHECKPOINTS = [
    ("glm52", "exl3-tp4", "brandonmusic/GLM-5.2-EXL3-TR3-3.0bpw", "0xSero/GLM-5.2-NVFP4-REAP-469B"),
    ("glm52", "nvfp4-tp8", "lukealonso/GLM-5.2-NVFP4", "0xSero/GLM-5.2-NVFP4-REAP-469B"),
    ("dsv4", "r7", "deepseek-ai/DeepSeek-V4-Flash-0731", "deepseek-ai/DeepSeek-V4-Flash"),
    ("dsv4", "r7-tp4", "deepseek-ai/DeepSeek-V4-Flash-0731", "deepseek-ai/DeepSeek-V4-Flash"),
    (
        "dsv4",
        "nvfp4-kv",
        "fraserprice/DeepSeek-V4-Flash-Abliterated-DSpark",
        "deepseek-ai/DeepSeek-V4-Flash",
    ),
]


def _show(cli: CliRunner, *args: str) -> str:
    # a wide terminal, so the notice stays on one line
    code, out, err = invoke(cli, "recipes", "show", *args)
    assert code == 0, err
    return " ".join(out.split())


@pytest.mark.parametrize(("recipe", "variant", "served", "default"), OTHER_CHECKPOINTS)
def test_recipes_show_says_the_variant_serves_another_checkpoint(
    cli: CliRunner, recipe: str, variant: str, served: str, default: str
) -> None:
    text = _show(cli, recipe, "-V", variant)
    assert f"model {served}" in text
    assert f"another checkpoint than the default's ({default})" in text
    assert "another checkpoint" not in _show(cli, recipe)
