"""`sm120 launch NAME`: resolve, check, and (without --dry-run) serve."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sm120.cli.errors import cli_errors

if TYPE_CHECKING:
    from sm120.cli.serving import GateRequest
    from sm120.plan import PlanRequest


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)


def _request(
    name: str,
    variant: list[str],
    sets: list[str],
    model_dir: str | None,
    port: int | None,
    host: str | None,
    force: list[str],
    env_file: Path | None,
    no_think: bool,
) -> PlanRequest:
    from sm120.dotenv import read_dotenv
    from sm120.plan import PlanRequest

    dotenv_path = env_file or (Path(".env") if Path(".env").is_file() else None)
    return PlanRequest(
        recipe=name,
        variants=tuple(v.strip() for item in variant for v in item.split(",") if v.strip()),
        sets=tuple(sets),
        model_dir=model_dir,
        port=port,
        host=host,
        thinking=False if no_think else None,
        force=tuple(force),
        dotenv=read_dotenv(dotenv_path) if dotenv_path else {},
        environ=dict(os.environ),
    )


@cli_errors
def launch(
    recipe: str = typer.Argument(..., help="Recipe to serve, e.g. glm52 (see 'sm120 recipes')."),
    variant: list[str] = typer.Option([], "--variant", "-V", help="Variant(s), in order."),
    sets: list[str] = typer.Option(
        [], "--set", help="KEY=VALUE: an engine flag without dashes or a recipe key."
    ),
    model_dir: str | None = typer.Option(None, "--model-dir", help="Checkpoint folder."),
    port: int | None = typer.Option(None, "--port", help="Port (default: the recipe's)."),
    host: str | None = typer.Option(None, "--host", help="Bind address (default 127.0.0.1)."),
    force: list[str] = typer.Option([], "--force", help="Skip a rule by id (recorded)."),
    env_file: Path | None = typer.Option(None, "--env-file", help="A .env file (default ./.env)."),
    no_think: bool = typer.Option(False, "--no-think", help="Reasoning off (recipe allowing)."),
    gpus: int | None = typer.Option(None, "--gpus", help="Check against N GPUs, not detected."),
    arch: str | None = typer.Option(None, "--arch", help="Check against this arch (sm_120)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; start nothing."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the plan as JSON."),
    runtime: str = typer.Option("native", "--runtime", help="Where the engine runs: native."),
    name: str | None = typer.Option(None, "--name", help="Deployment name (default: recipe)."),
    vllm_python: str | None = typer.Option(
        None, "--vllm-python", help="The engine's Python (else $VLLM_PYTHON / managed env)."
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", help="Key clients must send (default: generated, stored 0600)."
    ),
    replace: bool = typer.Option(False, "--replace", help="Stop a running deployment first."),
    foreground: bool = typer.Option(False, "--foreground", help="Stay attached until Ctrl-C."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds to wait for READY."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before long work."),
    gate: list[str] = typer.Option(
        [], "--gate", help="Gate suite(s) to pass before READY, e.g. core (see 'sm120 test')."
    ),
    keep_on_fail: bool = typer.Option(
        False, "--keep-on-fail", help="With --gate: keep the server running when it fails."
    ),
    gate_max_tokens: int | None = typer.Option(
        None, "--gate-max-tokens", help="With --gate: cap each answer (default: no cap)."
    ),
) -> None:
    """Resolve the plan, run the rules, and serve (or only print the plan with --dry-run)."""
    from sm120.checks import checked_plan, plan_document
    from sm120.hardware import declared

    gate_request = _gate_request(gate, keep_on_fail, gate_max_tokens)
    request = _request(recipe, variant, sets, model_dir, port, host, force, env_file, no_think)
    hardware = declared(gpus, arch)
    if hardware is None and not dry_run:
        from sm120.hardware import Hardware, detect

        hardware = detect() or Hardware(gpus=0, arch="cpu", source="detected")
    checked = checked_plan(request, hardware)
    if dry_run:
        if as_json:
            typer.echo(json.dumps(plan_document(checked), indent=2))
        else:
            from sm120.cli.present import show_plan

            show_plan(checked)
        if checked.failed:
            raise typer.Exit(1)
        return
    checked.raise_on_failure()
    if runtime != "native":
        from sm120.errors import SM120Error

        raise SM120Error(f"unknown runtime '{runtime}'", "use --runtime native")
    from sm120.cli.serving import serve
    from sm120.lifecycle.launcher import LaunchOptions

    options = LaunchOptions(
        name=name or checked.plan.recipe,
        vllm_python=vllm_python,
        api_key=api_key,
        replace=replace,
        timeout_s=timeout,
    )
    raise typer.Exit(serve(checked, options, foreground=foreground, gate=gate_request))


def _gate_request(
    gate: list[str], keep_on_fail: bool, max_tokens: int | None
) -> GateRequest | None:
    """Checked before anything starts: a typo in a suite name must not cost a model load."""
    from sm120.cli.gates import split_suites
    from sm120.cli.serving import GateRequest
    from sm120.errors import SM120Error
    from sm120.measure.cases import builtin_gates, select

    if not gate:
        if keep_on_fail or max_tokens is not None:
            raise SM120Error("--keep-on-fail and --gate-max-tokens need --gate", "e.g. --gate core")
        return None
    suites = split_suites(gate)
    for suite in suites:
        select(builtin_gates(), suite)
    if max_tokens is not None and max_tokens < 1:
        raise SM120Error(
            f"--gate-max-tokens must be 1 or more, got {max_tokens}", "or leave it out"
        )
    return GateRequest(tuple(suites), keep_on_fail, max_tokens)


def _ask(question: str) -> bool:
    return typer.confirm(question, default=True, err=True)
