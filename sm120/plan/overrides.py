"""`--set KEY=VALUE`: engine flag names (no dashes) or dotted recipe keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sm120.core.errors import PlanError, RecipeError
from sm120.core.suggest import did_you_mean
from sm120.recipe.catalogue import engine_flags
from sm120.recipe.loader import YamlTooLarge, parse_yaml
from sm120.recipe.schema import Recipe

# Recipe sections a --set may reach into; the rest (name, variants, ...) define the recipe.
SETTABLE_SECTIONS = (
    "model",
    "image",
    "hardware",
    "env",
    "smoke",
    "timeouts",
    "derive",
    "monitor",
    "args",
    "multinode",
    "kv_tier",
)
SETTABLE_SCALARS = ("thinking",)


@dataclass(frozen=True)
class Assignment:
    path: tuple[str, ...]  # ("args", "max-model-len") or ("model", "served_name") ...
    value: Any
    text: str  # as typed, for messages


def parse_value(raw: str, origin: str = "--set") -> Any:
    """YAML scalar rules: 131072 -> int, 0.8 -> float, true -> bool, {..} -> mapping.
    Parsed with the recipes' bounds: a --set value is no safer than a recipe file."""
    if raw == "":
        return ""
    try:
        return parse_yaml(raw, origin)
    except YamlTooLarge as exc:
        raise PlanError(exc.message, exc.hint) from None
    except RecipeError:
        return raw  # not YAML: the text as typed


def parse_assignment(text: str, engine: str) -> Assignment:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise PlanError(f"--set '{text}' is not KEY=VALUE", "e.g. --set max-model-len=131072")
    value = parse_value(raw.strip(), f"--set {key}")
    key = key.lstrip("-")
    head, _, rest = key.partition(".")
    if head in SETTABLE_SCALARS and not rest:
        return Assignment((head,), value, text)
    if head in SETTABLE_SECTIONS and rest:
        path = (head, *rest.split(".")) if head not in ("env", "args") else (head, rest)
        _check_section_key(path, text)
        return Assignment(path, value, text)
    flags = engine_flags(engine)
    if key in flags.flags:
        return Assignment(("args", key), value, text)
    if key in flags.reserved:
        flags.spec(key)  # raises the reserved-name error
    known = [*flags.flags, *SETTABLE_SCALARS, *(f"{s}." for s in SETTABLE_SECTIONS)]
    raise PlanError(
        f"--set: unknown key '{key}'{did_you_mean(key, known)}",
        f"use a {engine} flag name without dashes (e.g. max-model-len) or a recipe key "
        "(e.g. model.served_name, env.NCCL_P2P_DISABLE)",
    )


def _check_section_key(path: tuple[str, ...], text: str) -> None:
    """Each dotted part must name a field of the model it reaches into, down to a leaf
    (`model.served_name`, or one level further into a nested model: `model.dims.block_size`)."""
    if path[0] in ("env", "args"):
        return
    model: Any = _model_of(Recipe.model_fields[path[0]].annotation)
    for depth, part in enumerate(path[1:], start=1):
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            dotted = ".".join(path)
            prefix = ".".join(path[:depth])
            candidates = [f"{prefix}.{f}" for f in fields]
            raise PlanError(
                f"--set: unknown recipe key '{dotted}'{did_you_mean(dotted, candidates)}",
                "see recipes/recipe.schema.json for the keys",
            )
        model = _model_of(fields[part].annotation)
        if model is None and depth < len(path) - 1:
            raise PlanError(
                f"--set: unknown recipe key '{'.'.join(path)}': "
                f"'{'.'.join(path[: depth + 1])}' has no keys below it",
                "see recipes/recipe.schema.json for the keys",
            )


def _model_of(annotation: Any) -> Any:
    """The pydantic model an annotation names, looking inside `Model | None`; else None."""
    if hasattr(annotation, "model_fields"):
        return annotation
    for member in getattr(annotation, "__args__", ()):
        if hasattr(member, "model_fields"):
            return member
    return None
