"""Newer models of a recipe's family and faster published figures than a recipe's own, from
sm120/data/known_newer.yaml: what `sm120 recipes updates` names beside newer image tags.

Pure: the list is data shipped with the package, compared against the recipes as loaded. A
model line says whether a recipe already serves it; a figure line is named only while it
beats every figure the recipe publishes for the same GPU count.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sm120.core.yaml_data import load_yaml
from sm120.recipe.schema import Recipe


class KnownNewer(BaseModel):
    """One entry of known_newer.yaml (the file's header describes each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: tuple[str, ...] = Field(min_length=1)
    kind: Literal["model", "figure"]
    model: str
    decode_tok_s: float = Field(gt=0)
    gpus: int = Field(gt=0)
    config: str
    source: str = Field(pattern=r"^https?://\S+$")
    checked: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True)
class Newer:
    """A known-newer entry as it stands against one recipe."""

    recipe: str
    entry: KnownNewer
    status: str  # what the recipes already have of it, in words

    def as_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "source": "known",
            "kind": self.entry.kind,
            "model": self.entry.model,
            "decode_tok_s": self.entry.decode_tok_s,
            "gpus": self.entry.gpus,
            "config": self.entry.config,
            "link": self.entry.source,
            "checked": self.entry.checked,
            "status": self.status,
        }


@functools.cache
def known_newer() -> tuple[KnownNewer, ...]:
    text = resources.files("sm120.data").joinpath("known_newer.yaml").read_text("utf-8")
    return tuple(KnownNewer.model_validate(item) for item in load_yaml(text))


def published_by_gpus(recipe: Recipe) -> dict[int, float]:
    """The best decode figure a recipe publishes for each GPU count (default and variants)."""
    best: dict[int, float] = {}
    configurations = [(recipe.hardware, recipe.published)]
    for variant in recipe.variants.values():
        configurations.append((variant.hardware or recipe.hardware, variant.published))
    for hardware, published in configurations:
        if published is not None:
            figure = published.decode.tok_s
            best[hardware.gpus] = max(best.get(hardware.gpus, 0.0), figure)
    return best


def _serving(recipes: list[Recipe], model: str) -> list[str]:
    """Recipes whose checkpoint (default or a variant's) is that model: its repo id names it."""
    found = []
    for recipe in recipes:
        repos = [recipe.model.repo] + [v.model.repo for v in recipe.variants.values() if v.model]
        if any(repo and model.lower() in repo.lower() for repo in repos):
            found.append(recipe.name)
    return found


def compare(recipes: Iterable[Recipe], every: Iterable[Recipe] | None = None) -> list[Newer]:
    """The known-newer lines for `recipes`; `every` (default: the same) is where a recipe
    already serving a newer model is looked for."""
    chosen = list(recipes)
    pool = list(every) if every is not None else chosen
    lines = []
    for recipe in chosen:
        best = published_by_gpus(recipe)
        for entry in known_newer():
            if recipe.name not in entry.family:
                continue
            if entry.kind == "model":
                serving = _serving(pool, entry.model)
                status = f"served by {', '.join(serving)}" if serving else "no recipe serves it"
                lines.append(Newer(recipe.name, entry, status))
                continue
            own = best.get(entry.gpus)
            if own is not None and own >= entry.decode_tok_s:
                continue  # the recipe already publishes this figure or a better one
            status = (
                f"the recipe's best on {entry.gpus} GPUs: {own:g} tok/s"
                if own is not None
                else f"the recipe publishes no figure on {entry.gpus} GPUs"
            )
            lines.append(Newer(recipe.name, entry, status))
    return lines


def newer_lines(found: list[Newer]) -> list[str]:
    lines = []
    for item in found:
        entry = item.entry
        what = "newer model" if entry.kind == "model" else "faster figure"
        lines.append(
            f"{item.recipe + ' (known)':<24} {what}: {entry.model} {entry.decode_tok_s:g} tok/s "
            f"on {entry.gpus} GPUs ({entry.config}); {item.status}; {entry.source} "
            f"(checked {entry.checked})"
        )
    return lines
