"""What `sm120 validate` checks: schema, flag catalogue, why-notes and rules, for the default
and every variant of each recipe."""

from __future__ import annotations

from pathlib import Path

from sm120.core.errors import RecipeError, SM120Error
from sm120.plan.hardware import assumed
from sm120.plan.resolve import PlanRequest, resolve
from sm120.plan.rules import evaluate, failures
from sm120.recipe.figure_sources import figure_problems
from sm120.recipe.loader import load_recipe_file, recipe_names, recipes_dir
from sm120.recipe.schema import Recipe

# why-notes may also explain these recipe-level choices
_WHY_EXTRA_KEYS = {"model", "image", "hardware"}


def _settings(recipe: Recipe) -> set[str]:
    names = set(recipe.args) | set(recipe.env) | _WHY_EXTRA_KEYS
    launchers = [recipe.launcher, *(variant.launcher for variant in recipe.variants.values())]
    for variant in recipe.variants.values():
        names |= set(variant.args) | set(variant.env)
    for launcher in launchers:
        if launcher is not None:  # a launcher's knobs are its settings
            names |= set(launcher.knobs) | set(launcher.from_args)
    return names


def _check_why(recipe: Recipe, origin: str) -> None:
    known = _settings(recipe)
    notes = dict(recipe.why)
    for variant in recipe.variants.values():
        notes.update(variant.why)
    for key in notes:
        if key not in known:
            raise RecipeError(
                f"{origin}: why-note for '{key}', which no flag or variable of the recipe sets",
                "fix the key or remove the note",
            )


def validate_recipe(recipe: Recipe, origin: str) -> str:
    _check_why(recipe, origin)
    unpinned = next(figure_problems(recipe), None)
    if unpinned is not None:
        raise RecipeError(
            f"{origin}: {unpinned}",
            "a published figure names the commit of the page it was read in, or a thread",
        )
    combos: list[tuple[str, ...]] = [(), *((name,) for name in recipe.variants)]
    for variants in combos:
        label = ",".join(variants) or "default"
        try:
            plan = resolve(PlanRequest(recipe=recipe.name, variants=variants), recipe)
        except SM120Error as exc:
            raise RecipeError(f"{origin} [{label}]: {exc.message}", exc.hint) from None
        failed = failures(evaluate(plan, assumed(plan.hardware)))
        if failed:
            first = failed[0]
            raise RecipeError(
                f"{origin} [{label}]: rule {first.id} fails: {first.messages[0]}",
                "a recipe must pass its own rules on its validated hardware",
            )
    names = ", ".join(["default", *recipe.variants])
    return f"ok  {recipe.name}  ({names})"


def validate_files(paths: list[Path]) -> list[str]:
    targets = paths or [recipes_dir() / f"{name}.yaml" for name in recipe_names()]
    if not targets:
        raise RecipeError(f"no recipes found in {recipes_dir()}", "pass a recipe file")
    return [validate_recipe(load_recipe_file(path), str(path)) for path in targets]
