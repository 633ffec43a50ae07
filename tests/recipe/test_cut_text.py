"""Recipe text cannot be cut by a YAML comment: after unquoted text, ' #' starts a comment,
so `title: vLLM PR #41834 tag` would load as 'vLLM PR' (issue 39)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sm120.core.errors import RecipeError
from sm120.recipe.loader import load_recipe, parse_yaml, recipe_names

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_an_issue_number_after_unquoted_text_is_refused() -> None:
    with pytest.raises(RecipeError) as caught:
        parse_yaml("title: DeepSeek on SM120 (vLLM PR #41834 stable tag)\n", "r.yaml")
    assert caught.value.message == (
        "r.yaml: line 1: 'DeepSeek on SM120 (vLLM PR' is cut at '#41834 stable tag)': after "
        "unquoted text YAML reads ' #' as the start of a comment"
    )
    assert caught.value.hint == "put the whole value in double quotes"


def test_an_open_bracket_left_by_a_spaced_comment_is_refused() -> None:
    with pytest.raises(RecipeError, match="line 2: 'TP 2 \\(PR' is cut at '# 41834\\)'"):
        parse_yaml("hardware:\n  validated_on: TP 2 (PR # 41834)\n", "r.yaml")


def test_a_real_comment_after_a_value_still_loads() -> None:
    data = parse_yaml("gpus: 4  # four cards\nname: glm52 # the recipe\n", "r.yaml")
    assert data == {"gpus": 4, "name": "glm52"}


def test_quoted_text_keeps_its_hash() -> None:
    data = parse_yaml('title: "vLLM PR #41834 stable tag"\n', "r.yaml")
    assert data == {"title": "vLLM PR #41834 stable tag"}


def test_a_hash_inside_unquoted_text_is_text() -> None:
    # YAML starts a comment only at ' #': 'PR#41834' is plain text and loads whole.
    assert parse_yaml("title: vLLM PR#41834 tag\n", "r.yaml") == {"title": "vLLM PR#41834 tag"}


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_string_is_whole_in_its_raw_yaml(name: str) -> None:
    """Every string a recipe loads appears, quotes aside, on a source line without being
    followed by a glued ' #...' comment: a plain PyYAML load reads the same text."""
    text = (RECIPES / f"{name}.yaml").read_text(encoding="utf-8")
    load_recipe(name)  # the loader's own check passes
    for value in _strings(yaml.safe_load(text)):
        for line in text.splitlines():
            at = line.find(value)
            if at < 0 or line.lstrip().startswith("#"):
                continue
            after = line[at + len(value) :]
            assert (
                not after.lstrip("\"' ").startswith("#")
                or after.startswith(("'", '"'))
                or (after.startswith(" ") and after.lstrip(" ")[1:2] in (" ", ""))
            ), f"{name}: '{value}' is followed by '{after.strip()}' on its line"
