"""Find, parse and validate recipe files.

YAML is parsed with duplicate keys rejected (PyYAML silently keeps the last one, which would
hide a typo'd second `args:` block) and pydantic errors are turned into one line with a
did-you-mean for unknown keys.
"""

from __future__ import annotations

import os
import re
from collections.abc import Hashable
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sm120.core.bounded import MIB, read_text_capped
from sm120.core.errors import RecipeError, SM120Error
from sm120.core.suggest import did_you_mean
from sm120.recipe.schema import Recipe

# Recipes are a few KB, a few levels deep and a few hundred values once aliases are
# expanded; these bounds are far above that and far below what exhausts memory (a
# "billion laughs" of nested aliases costs nothing to parse and everything to walk).
MAX_RECIPE_BYTES = 1 * MIB
MAX_DEPTH = 32
MAX_VALUES = 100_000
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_READ_HINT = "a recipe is a small UTF-8 YAML file; see recipes/ for examples"


class YamlTooLarge(RecipeError):
    """YAML past a bound: nested too deep, too many values once aliases expand, or a number
    too long to read."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and nesting deeper than MAX_DEPTH (PyYAML
    composes recursively: a deep enough file would end in RecursionError)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
                raise YamlTooLarge(
                    f"line {line}: nested deeper than {MAX_DEPTH} levels",
                    "settings nest a few levels deep; check the brackets and indentation",
                )
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.ScalarNode) and node.style is None:
            _refuse_cut_text(node)
        return node


# After unquoted text, " #" starts a YAML comment: `title: vLLM PR #41834 tag` keeps only
# "vLLM PR". People write comments as "# words"; a '#' glued to what follows (#41834, #tag)
# or text left with an open bracket is text that was cut, not a comment.
_TRAILING_COMMENT = re.compile(r"[ \t]+#(\S*)")
_BRACKETS = {"(": ")", "[": "]", "{": "}"}


def _refuse_cut_text(node: yaml.ScalarNode) -> None:
    mark = node.end_mark
    buffer = getattr(mark, "buffer", None)
    if not isinstance(buffer, str) or mark.pointer >= len(buffer):
        return
    rest = buffer[mark.pointer :].split("\n", 1)[0]
    found = _TRAILING_COMMENT.match(rest)
    if not found:
        return
    text = str(node.value)
    unbalanced = any(text.count(o) > text.count(c) for o, c in _BRACKETS.items())
    if found.group(1) or unbalanced:
        cut = rest.strip()
        shown = cut if len(cut) <= 40 else cut[:40] + "..."
        raise RecipeError(
            f"line {mark.line + 1}: '{text}' is cut at '{shown}': after unquoted text YAML "
            "reads ' #' as the start of a comment",
            "put the whole value in double quotes",
        )


def _construct_unique_mapping(
    loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Hashable, Any]:
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            # `? [a, b]` or `? {a: 1}`: a list or mapping as a key, which no setting has.
            raise RecipeError(
                f"line {key_node.start_mark.line + 1}: a key that is a list or mapping",
                "keys are plain names, e.g. max-model-len",
            )
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise RecipeError(
                f"duplicate key '{key}' at line {key_node.start_mark.line + 1}",
                "each key may appear once per mapping; merge the two entries",
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_unique_mapping,
)


def parse_yaml(text: str, origin: str) -> Any:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except RecipeError as exc:
        raise type(exc)(f"{origin}: {exc.message}", exc.hint) from None
    except ValueError as exc:
        # int() refuses numbers of more than 4300 digits, and says so at length.
        problem = str(exc).split(";")[0].split(":")[0]
        raise YamlTooLarge(
            f"{origin}: a value YAML cannot read ({problem})", "check the numbers"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError(
            f"{origin}:{where}: malformed YAML: {problem}", "check indentation and quoting"
        ) from None
    _check_size(data, origin)
    return data


def _check_size(data: Any, origin: str) -> None:
    """Count values with aliases expanded, stopping at MAX_VALUES: what a consumer walking
    the tree (validation, hashing, JSON) would pay."""
    budget = MAX_VALUES
    stack = [data]
    while stack:
        item = stack.pop()
        budget -= 1
        if budget < 0:
            raise YamlTooLarge(
                f"{origin}: the YAML expands to more than {MAX_VALUES:,} values",
                "YAML aliases (*name) repeat what they point at; write the values out instead",
            )
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def read_recipe_text(path: Path) -> str:
    try:
        return read_text_capped(path, MAX_RECIPE_BYTES, "recipe", _READ_HINT)
    except SM120Error as exc:
        raise RecipeError(exc.message, exc.hint) from None


def recipes_dir() -> Path:
    """The recipes folder: $SM120_RECIPES_DIR, the checkout's recipes/, or the bundled copy."""
    override = os.environ.get("SM120_RECIPES_DIR")
    if override:
        return Path(override)
    package = Path(__file__).resolve().parent.parent
    checkout = package.parent / "recipes"
    if checkout.is_dir():
        return checkout
    return package / "_bundled" / "recipes"


def existing_recipes_dir() -> Path:
    """recipes_dir(), which must be a folder: a mistyped SM120_RECIPES_DIR would otherwise
    list no recipes and call every name unknown."""
    folder = recipes_dir()
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise RecipeError(f"the recipes folder {folder} {what}", "fix or unset SM120_RECIPES_DIR")
    return folder


def recipe_names() -> list[str]:
    return sorted(p.stem for p in existing_recipes_dir().glob("*.yaml"))


def _model_fields(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """Field names valid at `path` inside the model tree, for did-you-mean."""
    current: Any = model
    for part in path:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return []
        annotation = fields[part].annotation
        current = _first_model(annotation)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _explain(error: ValidationError, origin: str) -> RecipeError:
    errors = error.errors()
    # An unknown key usually explains the "missing" error next to it (a typo'd name).
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(first["loc"])
    dotted = ".".join(str(p) for p in loc)
    if first["type"] == "extra_forbidden":
        key = str(loc[-1])
        parent = loc[:-1]
        # Variants are a dict of name -> Variant: skip the variant name when looking up fields.
        candidates = _model_fields(Recipe, parent) or _variant_fields(parent)
        return RecipeError(
            f"{origin}: unknown key '{dotted}'{did_you_mean(key, candidates)}",
            "see recipes/recipe.schema.json for the allowed keys",
        )
    if first["type"] == "missing":
        return RecipeError(f"{origin}: missing required key '{dotted}'", "add it to the recipe")
    # A model-level check (several fields together) has no location; its ValueError text is
    # the message, without pydantic's "Value error, " prefix.
    message = str(first["msg"]).removeprefix("Value error, ")
    where = f"{origin}: {dotted}" if dotted else origin
    return RecipeError(f"{where}: {message}", "fix the value in the recipe")


def _variant_fields(parent: tuple[str | int, ...]) -> list[str]:
    if len(parent) >= 2 and parent[0] == "variants":
        return _model_fields(Recipe.model_fields["variants"].annotation.__args__[1], parent[2:])  # type: ignore[union-attr]
    return []


def recipe_from_data(data: Any, origin: str) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"{origin}: a recipe must be a YAML mapping", "start with 'name: ...'")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, origin) from None


def load_recipe_file(path: Path) -> Recipe:
    recipe = recipe_from_data(parse_yaml(read_recipe_text(path), str(path)), str(path))
    if recipe.name != path.stem:
        raise RecipeError(
            f"{path}: name '{recipe.name}' does not match the file name '{path.stem}'",
            f"rename the file to {recipe.name}.yaml or fix 'name'",
        )
    return recipe


def raw_recipe_data(name: str) -> dict[str, Any]:
    """The parsed YAML of a named recipe, before validation (overrides are merged into it)."""
    path = recipe_path(name)
    data = parse_yaml(read_recipe_text(path), str(path))
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping", "start with 'name: ...'")
    return data


def recipe_path(name: str) -> Path:
    """The file of a named recipe. A name is a name, never a path: `../x` or `/tmp/x`
    would read files outside the recipes folder (`sm120 validate FILE` takes paths)."""
    if not NAME_PATTERN.match(name):
        shown = name if len(name) <= 40 else f"{name[:40]}... ({len(name)} characters)"
        raise RecipeError(
            f"'{shown}' is not a recipe name: lowercase letters, digits and '-', "
            "at most 64 characters",
            "run 'sm120 recipes' to list them; 'sm120 validate FILE' checks a file",
        )
    folder = existing_recipes_dir()
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = recipe_names()
        raise RecipeError(
            f"unknown recipe '{name}'{did_you_mean(name, known)}",
            "run 'sm120 recipes' to list them",
        )
    return path


@lru_cache(maxsize=32)
def _cached_load(path: Path, mtime: float) -> Recipe:
    return load_recipe_file(path)


def load_recipe(name: str) -> Recipe:
    path = recipe_path(name)
    return _cached_load(path, path.stat().st_mtime)


def targets_by_arch() -> dict[str, list[str]]:
    """Which recipes and variants are validated on each compute capability, as a user would
    launch them ("glm52", "tiny -V gpu"); recipes that fail to load are left out."""
    found: dict[str, list[str]] = {}
    for name in recipe_names():
        try:
            recipe = load_recipe(name)
        except RecipeError:
            continue
        for arch in recipe.hardware.compute_caps:
            found.setdefault(arch, []).append(name)
        for variant_name, variant in recipe.variants.items():
            if variant.hardware is None:
                continue
            for arch in variant.hardware.compute_caps:
                if name not in found.get(arch, []):
                    found.setdefault(arch, []).append(f"{name} -V {variant_name}")
    return found
