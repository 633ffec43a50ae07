"""`sm120 build`, `sm120 info` and `sm120 compose`: images and what is inside them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from sm120.cli.errors import cli_errors


def register(app: typer.Typer) -> None:
    app.command("build")(build)
    app.command("info")(info)
    app.command("compose")(compose)


def _plan(recipe: str, variant: list[str]):  # type: ignore[no-untyped-def]
    from sm120.plan import PlanRequest, resolve

    variants = tuple(v.strip() for item in variant for v in item.split(",") if v.strip())
    return resolve(PlanRequest(recipe=recipe, variants=variants, environ=dict(os.environ)))


def _build_args(pairs: list[str]) -> dict[str, str]:
    from sm120.errors import SM120Error

    args: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SM120Error(
                f"--build-arg expects KEY=VALUE, got '{pair}'", "e.g. --build-arg TORCH_INDEX_URL="
            )
        args[key] = value
    return args


@cli_errors
def build(
    recipe: str = typer.Argument(..., help="Recipe whose image to build, e.g. tiny."),
    variant: list[str] = typer.Option([], "--variant", "-V", help="Variant(s) (may change image)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the build; run nothing."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild every layer; never reuse."),
    wheel: list[Path] = typer.Option([], "--wheel", help="A wheel to put in the context (repeat)."),
    build_arg: list[str] = typer.Option([], "--build-arg", help="KEY=VALUE over the recipe's."),
    network: str | None = typer.Option(None, "--network", help="Build network (e.g. host)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Build the recipe's image, tagged sm120/RECIPE:PLAN-HASH and labelled with its manifest."""
    from sm120.images.build import BuildOptions, plan_build
    from sm120.images.build import build as build_image

    plan = _plan(recipe, variant)
    options = BuildOptions(
        no_cache=no_cache, wheels=tuple(wheel), network=network, build_args=_build_args(build_arg)
    )
    if dry_run:
        described, _ = plan_build(plan, options)
        typer.echo(json.dumps(described.as_dict(), indent=2))
        return
    from sm120 import docker_api

    client = docker_api.connect()
    result = build_image(client, plan, options, _progress)
    if as_json:
        summary = {"tag": result.tag, "image_id": result.image_id, "reused": result.reused}
        typer.echo(json.dumps(summary))
    else:
        verb = "reused" if result.reused else "built"
        typer.echo(f"{result.tag}  ({verb} {result.image_id[:19]})")


def _progress(line: str) -> None:
    sys.stderr.write(f"  {line}\n")
    sys.stderr.flush()


@cli_errors
def info(
    target: str | None = typer.Argument(
        None, help="Deployment, recipe, image or container (default: the running deployment)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """What an image carries: base digest, engine ref and commit, patches and failure ids."""
    from sm120.images.info import read_info

    found = read_info(target)
    if as_json:
        typer.echo(json.dumps({"source": found.source, "manifest": found.manifest}, indent=2))
        return
    for line in found.describe():
        typer.echo(line)


@cli_errors
def compose(
    recipe: str = typer.Argument(..., help="Recipe to write a compose file for."),
    variant: list[str] = typer.Option([], "--variant", "-V", help="Variant(s), in order."),
    output: Path | None = typer.Option(None, "--output", "-o", help="File (default: stdout)."),
    model_dir: str | None = typer.Option(None, "--model-dir", help="Checkpoint folder."),
    port: int | None = typer.Option(None, "--port", help="Port (default: the recipe's)."),
) -> None:
    """Write a standalone compose file that serves the plan (no .env needed)."""
    from sm120.plan import PlanRequest, resolve
    from sm120.render.compose import render_compose_file

    variants = tuple(v.strip() for item in variant for v in item.split(",") if v.strip())
    plan = resolve(PlanRequest(recipe=recipe, variants=variants, model_dir=model_dir, port=port))
    text = render_compose_file(plan)
    if output is None:
        typer.echo(text, nl=False)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            from sm120.errors import SM120Error

            raise SM120Error(
                f"cannot write {output}: {exc.strerror or exc}",
                "pass -o a file in a folder that exists and is writable, or leave -o out",
            ) from None
        typer.echo(f"wrote {output} (docker compose -f {output} up)", err=True)
