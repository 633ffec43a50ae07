"""`sm120 launch NAME`: resolve, check, and (without --dry-run) serve."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sm120.cli.errors import cli_errors

if TYPE_CHECKING:
    from sm120.checks import CheckedPlan
    from sm120.plan import PlanRequest
    from sm120.render.multinode import NodeAddress, NodeLaunch


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
    nodes: str | None = typer.Option(
        None,
        "--nodes",
        help="Span hosts, head first: HOST1,HOST2,... (host or user@host; SSH, or Docker "
        "over ssh:// with --runtime docker). Needs a multi-node variant.",
    ),
    ssh_option: list[str] = typer.Option(
        [], "--ssh-option", help="An ssh -o option for --nodes, e.g. IdentityFile=~/.ssh/k."
    ),
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
) -> None:
    """Resolve the plan, run the rules, and serve (or only print the plan with --dry-run)."""
    from sm120.checks import checked_plan, plan_document
    from sm120.hardware import declared

    request = _request(recipe, variant, sets, model_dir, port, host, force, env_file, no_think)
    addresses = None
    if nodes is not None:
        from sm120.cluster.hosts import parse_nodes

        addresses = parse_nodes(nodes)
    hardware = declared(gpus, arch)
    # Nodes of a multi-node plan are checked one by one at launch, not against this machine.
    if hardware is None and not dry_run and addresses is None:
        from sm120.hardware import Hardware, detect

        hardware = detect() or Hardware(gpus=0, arch="cpu", source="detected")
    checked = checked_plan(request, hardware)
    launches = _node_launches(checked, addresses, runtime) if addresses is not None else None
    if dry_run:
        document = plan_document(checked)
        if launches is not None:
            document["nodes"] = [launch.as_dict() for launch in launches]
        if as_json:
            typer.echo(json.dumps(document, indent=2))
        else:
            from sm120.cli.present import show_nodes, show_plan

            show_plan(checked)
            if launches is not None:
                show_nodes(launches)
        if checked.failed:
            raise typer.Exit(1)
        return
    if addresses is None:
        from sm120.cluster.hosts import require_nodes

        require_nodes(checked.plan)
    checked.raise_on_failure()
    if addresses is not None:
        from sm120.cli.serving import serve
        from sm120.cluster.launch import ClusterRequest
        from sm120.lifecycle.launcher import LaunchOptions

        options = LaunchOptions(
            name=name or checked.plan.recipe,
            vllm_python=vllm_python,
            api_key=api_key,
            replace=replace,
            timeout_s=timeout,
        )
        cluster = ClusterRequest(addresses, runtime, tuple(ssh_option))
        raise typer.Exit(serve(checked, options, foreground=foreground, cluster=cluster))
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
    raise typer.Exit(serve(checked, options, foreground=foreground))


def _node_launches(
    checked: CheckedPlan, addresses: list[NodeAddress], runtime: str
) -> list[NodeLaunch]:
    from sm120.cluster.hosts import check_nodes_fit
    from sm120.cluster.nodes import RUNTIMES
    from sm120.errors import SM120Error
    from sm120.recipe.loader import load_recipe
    from sm120.render.compose import CONTAINER_MODEL_DIR
    from sm120.render.multinode import render_nodes

    if runtime not in RUNTIMES:
        raise SM120Error(
            f"unknown runtime '{runtime}' for --nodes", "use --runtime native or docker"
        )
    plan = checked.plan
    check_nodes_fit(plan, load_recipe(plan.recipe), addresses)
    docker = runtime == "docker" and plan.model_dir
    return render_nodes(
        plan, addresses, container_model_dir=CONTAINER_MODEL_DIR if docker else None
    )


def _ask(question: str) -> bool:
    return typer.confirm(question, default=True, err=True)
