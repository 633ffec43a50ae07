"""`sm120 build`, `sm120 info` and `sm120 compose`: images and what is inside them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from sm120.cli.errors import cli_errors
from sm120.cli.options import PortOpt, VariantsOpt
from sm120.compose.request import ComposeRequest


def register(app: typer.Typer) -> None:
    app.command("build")(build)
    app.command("info")(info)
    app.command("compose")(compose)


def _plan(recipe: str, variant: list[str], env_file: Path):  # type: ignore[no-untyped-def]
    from sm120.plan.request import plan_request
    from sm120.plan.resolve import resolve

    # --env-file names the file --write-env edits; it need not exist yet.
    dotenv = env_file if env_file.is_file() else None
    return resolve(plan_request(recipe, environ=os.environ, variants=variant, env_file=dotenv))


def _build_args(pairs: list[str]) -> dict[str, str]:
    """KEY=VALUE pairs; what a value may hold is BuildOptions' to check."""
    from sm120.core.errors import SM120Error
    from sm120.images.build import BUILD_ARG_HINT

    args: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SM120Error(f"--build-arg expects KEY=VALUE, got '{pair}'", BUILD_ARG_HINT)
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
    write_env: bool = typer.Option(
        False, "--write-env", help="Put IMAGE, RECIPE and VARIANT into the .env file."
    ),
    env_file: Path = typer.Option(Path(".env"), "--env-file", help="The .env --write-env edits."),
    check: bool = typer.Option(
        False, "--check", help="Check locks, toolkit isolation and base pins; build nothing."
    ),
    resolve_locks: bool = typer.Option(
        False, "--resolve", help="With --check: resolve the locks again (needs the index)."
    ),
    lock: bool = typer.Option(
        False, "--lock", help="Write the image's engine and toolkit locks (needs the network)."
    ),
    refresh_pins: bool = typer.Option(
        False, "--refresh-pins", help="Pin each base image to its registry digest."
    ),
) -> None:
    """Build the recipe's image, tagged sm120/RECIPE:IMAGE-HASH and labelled with its manifest."""
    from sm120.images.build import BuildOptions, build_locally, plan_build

    plan = _plan(recipe, variant, env_file)
    if check:
        _check(plan, resolve_locks, as_json)
        return
    if lock:
        from sm120.images.locking import make_locks

        for path in make_locks(plan, _progress):
            typer.echo(f"wrote {path}")
        return
    if refresh_pins:
        from sm120.images.pins import refresh_recipe_pins

        for pinned in refresh_recipe_pins(recipe):
            typer.echo(f"{pinned.ref}@{pinned.digest}  ({', '.join(pinned.files)})")
        return
    options = BuildOptions(
        no_cache=no_cache, wheels=tuple(wheel), network=network, build_args=_build_args(build_arg)
    )
    if dry_run:
        described, _ = plan_build(plan, options)
        typer.echo(json.dumps(described.as_dict(), indent=2))
        return
    result = build_locally(plan, options, _progress)
    if write_env:
        from sm120.images.envfile import write_image

        write_image(env_file, plan, result.tag)
        typer.echo(f"wrote IMAGE={result.tag} to {env_file}", err=True)
    if as_json:
        summary = {"tag": result.tag, "image_id": result.image_id, "reused": result.reused}
        typer.echo(json.dumps(summary))
    else:
        verb = "reused" if result.reused else "built"
        typer.echo(f"{result.tag}  ({verb} {result.image_id[:19]})")


def _check(plan, resolve_locks: bool, as_json: bool) -> None:  # type: ignore[no-untyped-def]
    from sm120.images.check import check_image
    from sm120.images.context import source_root

    checked = check_image(source_root(), plan, resolve=resolve_locks)
    if as_json:
        typer.echo(json.dumps(checked.as_dict(), indent=2))
    else:
        for key, value in checked.as_dict().items():
            if key not in ("conflicts", "ok"):
                typer.echo(f"{key:<19}{json.dumps(value) if isinstance(value, dict) else value}")
        for conflict in checked.conflicts:
            typer.echo(f"conflict           {conflict}")
    if not checked.ok:
        raise typer.Exit(1)


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
    recipes: list[str] = typer.Argument(
        ..., help="Recipe(s); several (or NAME=RECIPE) write a project with the gateway."
    ),
    variant: VariantsOpt = [],  # noqa: B006 - Typer copies it
    output: Path | None = typer.Option(None, "--output", "-o", help="File (default: stdout)."),
    model_dir: str | None = typer.Option(None, "--model-dir", help="Checkpoint folder."),
    port: PortOpt = None,
    ports: list[str] = typer.Option([], "--ports", help="NAME=PORT for a service (repeat)."),
    gpus: list[str] = typer.Option([], "--gpus", help="NAME=0,1: a service's GPUs (repeat)."),
    gateway_port: int = typer.Option(
        ComposeRequest.gateway_port, "--gateway-port", help="The gateway's port."
    ),
    host_network: bool = typer.Option(
        False, "--host-network", help="Run every service on the host's network."
    ),
) -> None:
    """Write a standalone compose file that serves the plan (no .env needed).

    With several recipes (or NAME=RECIPE), a project: one service each, the gateway routing
    to them by model, and their keys in secrets/ beside the file (see docs/gateway.md)."""
    from sm120.compose.write import write_compose

    composed = write_compose(
        ComposeRequest(
            recipes=tuple(recipes),
            output=output,
            variants=tuple(variant),
            model_dir=model_dir,
            port=port,
            ports=tuple(ports),
            gpus=tuple(gpus),
            gateway_port=gateway_port,
            host_network=host_network,
            environ=dict(os.environ),
        )
    )
    if composed.text is not None:
        typer.echo(composed.text, nl=False)
    for note in composed.notes():
        typer.echo(note, err=True)
