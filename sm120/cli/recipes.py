"""`sm120 recipes` and `sm120 recipes show NAME`."""

from __future__ import annotations

import json
import os

import typer

from sm120.cli.errors import cli_errors
from sm120.cli.options import VariantsOpt

app = typer.Typer(help="List recipes, or show one resolved.", no_args_is_help=False)


@app.callback(invoke_without_command=True)
@cli_errors
def list_recipes(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="One JSON array on stdout."),
) -> None:
    """Table of recipes: model, engine, GPUs, validated hardware, baseline."""
    if ctx.invoked_subcommand is not None:
        return
    from sm120.cli.present import recipe_rows, recipes_table

    rows = recipe_rows()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        recipes_table(rows)


@app.command("show")
@cli_errors
def show(
    name: str = typer.Argument(..., help="Recipe name, e.g. glm52."),
    variant: VariantsOpt = [],  # noqa: B006 - Typer copies it
    as_json: bool = typer.Option(False, "--json", help="The plan as JSON."),
) -> None:
    """The resolved plan of a recipe with the why of every setting."""
    from sm120.cli.present import show_plan
    from sm120.deploy.checked import checked_plan, plan_document
    from sm120.deploy.tuned import tuned_summary
    from sm120.plan.request import plan_request

    checked = checked_plan(plan_request(name, environ=os.environ, variants=variant))
    if as_json:
        document = plan_document(checked)
        tuned = tuned_summary(checked.plan)
        if tuned is not None:  # beside the published figure and the roofline
            document["tuned"] = tuned
        typer.echo(json.dumps(document, indent=2))
    else:
        show_plan(checked)


@app.command("updates")
@cli_errors
def updates(
    names: list[str] = typer.Argument(None, help="Recipes to check (default: all)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON array on stdout."),
) -> None:
    """Newer engine images or wheels than each recipe pins (needs the network), then newer
    models of each recipe's family and faster published figures than its own (known list).

    Exits 0 when at least one engine build was checked, even if some registry did not
    answer (its line says so); exits 2 with one line when none could be checked (offline)."""
    from sm120.cli.present import update_lines
    from sm120.images.updates import find_updates
    from sm120.recipe.loader import load_recipe, recipe_names
    from sm120.recipe.newer import compare, newer_lines

    chosen = [load_recipe(name) for name in (names or recipe_names())]
    known = compare(chosen, [load_recipe(name) for name in recipe_names()])
    found = find_updates(chosen)
    if as_json:
        rows = [u.as_dict() for u in found] + [k.as_dict() for k in known]
        typer.echo(json.dumps(rows, indent=2))
    else:
        for line in update_lines(found) + newer_lines(known):
            typer.echo(line)
