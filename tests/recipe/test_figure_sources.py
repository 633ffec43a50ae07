"""Every published figure in every recipe names where it can be read again (commit or date).

The first test walks all recipes on disk, so a recipe added later is held to it too.
"""

from __future__ import annotations

import pytest

from sm120.recipe.figure_sources import figure_problems, unpinned_link
from sm120.recipe.loader import load_recipe, recipe_names
from sm120.recipe.schema import Recipe


def test_no_published_figure_in_any_recipe_lacks_a_commit_or_date() -> None:
    names = recipe_names()
    assert {"glm47", "dsv4", "glm52"} <= set(names)
    problems = [line for name in names for line in figure_problems(load_recipe(name))]
    assert problems == []


@pytest.mark.parametrize(
    "source",
    [
        "https://github.com/vllm-project/vllm/pull/41834",
        "https://github.com/local-inference-lab/rtx6kpro/issues/67",
        "https://github.com/AlexGS74/glm47-nvfp4-sm120/blob/2a4692d/README.md",
        "https://github.com/local-inference-lab/rtx6kpro/blob/e2149f1792ba19d803df81588bb0c06ed5cb4335/models/x.md",
        "https://github.com/o/r/tree/0b7ddb2/models",
        "https://github.com/o/r/commit/0b7ddb2",
        "https://raw.githubusercontent.com/o/r/9f0ddc8a3899bef11e57fadf2f6cdd727c034e2d/x.yml",
        "https://huggingface.co/o/m/blob/9297b9f1/README.md",
        "https://example.org/benchmarks.html",
    ],
)
def test_pinned_and_thread_links_pass(source: str) -> None:
    assert unpinned_link(source) is None


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (
            "https://github.com/local-inference-lab/rtx6kpro/blob/master/benchmarks/k.md",
            "names a branch or tag, not a commit",
        ),
        ("https://github.com/o/r/blob/main/docs/x.md", "names a branch or tag, not a commit"),
        ("https://github.com/0xSero/glm-5.2-sm120", "names a repository, not a commit"),
        ("https://github.com/o/r/tree/v0.16.0/x", "names a branch or tag, not a commit"),
        ("https://raw.githubusercontent.com/o/r/main/x.yml", "names a branch or tag, not a commit"),
        ("https://huggingface.co/o/m", "names a repository, not a commit"),
    ],
)
def test_branch_and_repository_links_are_named(source: str, why: str) -> None:
    assert unpinned_link(source) == why


def _with_published(figures: dict[str, object], variant: bool = False) -> Recipe:
    recipe = load_recipe("glm47")
    data = recipe.model_dump(mode="json", exclude_none=True)
    if variant:
        data["variants"]["vllm-0.15.1"]["published"] = figures
    else:
        data["published"] = figures
    return Recipe.model_validate(data)


FIGURE = {
    "tok_s": 48,
    "hardware": "4x RTX PRO 6000",
    "date": "2026-02-21",
    "engine_ref": "vllm 0.15.1",
}


def test_a_branch_link_in_a_default_figure_is_refused_with_its_line() -> None:
    source = "https://github.com/AlexGS74/glm47-nvfp4-sm120/blob/main/docs/w.md"
    recipe = _with_published({"decode": {**FIGURE, "source": source}})
    assert list(figure_problems(recipe)) == [
        f"glm47 default: the decode figure's source {source} names a branch or tag, not a commit "
        "(link the commit it was read at)"
    ]


def test_a_variant_throughput_figure_and_an_undated_acceptance_are_refused() -> None:
    pinned = "https://github.com/o/r/blob/c115ca0/x.md"
    recipe = _with_published(
        {
            "decode": {**FIGURE, "source": pinned},
            "throughput": {**FIGURE, "source": "https://github.com/o/r", "concurrency": 8},
            "acceptance": {"accepted_per_pass": 1.4, "source": "the model page's table"},
        },
        variant=True,
    )
    assert [line for line in figure_problems(recipe) if "vllm-0.15.1" in line] == [
        "glm47 variant vllm-0.15.1: the throughput figure's source https://github.com/o/r "
        "names a repository, not a commit (link the commit it was read at)",
        "glm47 variant vllm-0.15.1: the acceptance figure's source names no commit or date "
        "(add the one it was read at)",
    ]
