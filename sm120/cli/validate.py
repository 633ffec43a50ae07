"""`sm120 validate [FILE]` for recipe authors, and `sm120 schema` to export the JSON schema."""

from __future__ import annotations

from pathlib import Path

import typer

from sm120.cli.errors import cli_errors


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("schema")(schema)


@cli_errors
def validate(
    files: list[Path] = typer.Argument(None, help="Recipe files; all bundled recipes if none."),
) -> None:
    """Check recipe files against the schema, the flag catalogue and the rules."""
    from sm120.plan.validate import validate_files

    for line in validate_files(list(files or [])):
        typer.echo(line)


@cli_errors
def schema(
    write: bool = typer.Option(False, "--write", help="Write recipes/recipe.schema.json."),
) -> None:
    """Print the recipe JSON schema (or write the committed copy)."""
    from sm120.recipe.export import schema_path, schema_text

    text = schema_text()
    if write:
        schema_path().write_text(text, encoding="utf-8")
        typer.echo(f"wrote {schema_path()}", err=True)
    else:
        typer.echo(text, nl=False)
