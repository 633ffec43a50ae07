"""The docs say what the code does: every `sm120 ...` command in README.md and docs/*.md
names real commands, options and recipes, and every model a doc says a recipe serves is
the name that recipe serves."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import pytest
import typer.main

from sm120.cli.app import app
from sm120.recipe.loader import load_recipe, recipe_names
from tests.helpers import REPO

# commands.md is generated from the CLI itself (tests/cli/test_docs.py keeps it current).
DOCS = [
    REPO / "README.md",
    *sorted(path for path in (REPO / "docs").glob("*.md") if path.name != "commands.md"),
]
# `sm120 ...` inside inline code, or a line of a code block.
_INLINE = re.compile(r"`(sm120 [^`]+)`")
_FENCE = re.compile(r"^```")
# Commands whose first argument is a recipe name.
RECIPE_FIRST = {("launch",), ("plan",), ("recipes", "show"), ("build",), ("download",)}
# "serves `X`" / serves model "X": a claim about a served model name.
_SERVES = re.compile(r"(\w+)\W+serves (?:the )?(?:model )?[\"`]([^\"`]+)[\"`]")


def doc_commands() -> Iterator[tuple[str, str]]:
    for path in DOCS:
        in_block = False
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            where = f"{path.relative_to(REPO)}:{number}"
            if _FENCE.match(line.strip()):
                in_block = not in_block
                continue
            if in_block:
                code = line.split("#", 1)[0].strip()
                for part in re.split(r"&&|\|\||;|\|", code):
                    part = part.strip()
                    if part.startswith("sm120 "):
                        yield where, part
            else:
                for found in _INLINE.finditer(line):
                    yield where, found.group(1)


@lru_cache(maxsize=1)
def root() -> Any:
    return typer.main.get_command(app)


def _tokens(command: str) -> list[str]:
    try:
        return shlex.split(command)[1:]
    except ValueError:
        return command.split()[1:]


def check_command(command: str) -> str | None:
    """What is wrong with a documented command line, or None."""
    tokens = _tokens(command)
    node, path = root(), []
    while tokens and hasattr(node, "commands") and tokens[0] in node.commands:
        path.append(tokens[0])
        node = node.commands[tokens.pop(0)]
    if not path and not (tokens and tokens[0].startswith("-")):
        return f"no command '{tokens[0] if tokens else ''}'"
    known = {opt for param in node.params for opt in (*param.opts, *param.secondary_opts)}
    known.add("--help")  # Click adds it to every command when it parses
    for token in tokens:
        for option in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", token):
            flag = option.split("=", 1)[0]
            if flag not in known and not token.startswith(("'", '"')) and "=" not in token[:1]:
                return f"'{' '.join(['sm120', *path])}' has no option {flag}"
    if tuple(path) in RECIPE_FIRST and tokens and not tokens[0].startswith(("-", "[")):
        name = tokens[0]
        if name.islower() and name not in recipe_names() and name not in ("name", "recipe"):
            return f"no recipe '{name}'"
    return None


def served_names(recipe: str) -> set[str]:
    loaded = load_recipe(recipe)
    names = {loaded.model.served_name}
    for variant in loaded.variants.values():
        model = getattr(variant, "model", None)
        if isinstance(model, dict) and model.get("served_name"):
            names.add(model["served_name"])
    return names


def test_every_documented_command_resolves() -> None:
    found = list(doc_commands())
    assert len(found) > 40  # the scan reads the docs
    problems = [f"{where}: {cmd!r}: {why}" for where, cmd in found if (why := check_command(cmd))]
    assert problems == []


def wrong_served_names(line: str) -> list[str]:
    """For a line saying a recipe serves a model: the claims its recipes contradict."""
    wrong = []
    for match in _SERVES.finditer(line):
        model = match.group(2)
        for recipe in [name for name in recipe_names() if re.search(rf"\b{name}\b", line)]:
            if model != recipe and model not in served_names(recipe):
                wrong.append(f"{recipe} serves {sorted(served_names(recipe))}, not {model!r}")
    return wrong


def test_every_model_a_doc_says_a_recipe_serves_is_its_served_name() -> None:
    wrong = [
        f"{path.relative_to(REPO)}:{number}: {problem}"
        for path in DOCS
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        for problem in wrong_served_names(line)
    ]
    assert wrong == []


def test_a_wrong_served_name_is_caught() -> None:
    # docs/gateway.md said this before the test existed.
    old = 'sm120 launch glm52 --name day                  # serves model "glm-5.2"'
    assert wrong_served_names(old) == ["glm52 serves ['GLM-5.2-NVFP4-REAP-469B'], not 'glm-5.2'"]


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("sm120 lunch tiny", "no command 'lunch'"),
        ("sm120 launch tiny --dry-rn", "'sm120 launch' has no option --dry-rn"),
        ("sm120 launch glm99", "no recipe 'glm99'"),
        ("sm120 launch glm52 --dry-run --json", None),
    ],
)
def test_the_check_trips_on_each_kind_of_drift(command: str, problem: str | None) -> None:
    assert check_command(command) == problem
