"""`sm120 launch NAME`: resolve, check, and (without --dry-run) serve."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sm120.cli.errors import cli_errors

if TYPE_CHECKING:
    from sm120.cli.serving import GateRequest
    from sm120.deploy.checked import CheckedPlan
    from sm120.plan.resolve import LaunchPlan as PlanT
    from sm120.plan.resolve import PlanRequest
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
    from sm120.core.dotenv import read_dotenv
    from sm120.plan.resolve import PlanRequest

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
    gpus: str | None = typer.Option(
        None,
        "--gpus",
        help="N: check against N GPUs, not detected. 0,1 or device=3: run on these GPUs.",
    ),
    arch: str | None = typer.Option(None, "--arch", help="Check against this arch (sm_120)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; start nothing."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the plan as JSON."),
    runtime: str = typer.Option(
        "native", "--runtime", help="Where the engine runs: native or docker."
    ),
    network: str = typer.Option(
        "bridge", "--network", help="Docker runtime: bridge (port published) or host."
    ),
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
    foreground: bool = typer.Option(
        False,
        "--foreground",
        help="Stay attached while the engine runs; Ctrl-C/SIGTERM stops it (for services).",
    ),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds to wait for READY."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before long work."),
    no_monitor: bool = typer.Option(
        False, "--no-monitor", help="Do not start the monitor (peaks, watchdog) after READY."
    ),
    restart: str | None = typer.Option(
        None,
        "--restart",
        help="When the server dies: no, on-failure or on-failure:N restarts per window "
        "(default: the recipe's monitor.restart, or .env RESTART).",
    ),
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
    from sm120.deploy.checked import checked_plan, plan_document
    from sm120.plan.hardware import declared

    gate_request = _gate_request(gate, keep_on_fail, gate_max_tokens)
    count, placement = _gpu_choice(gpus)
    if placement is not None:
        from sm120.plan.gpu_sets import PLACEMENT_ENV, placement_set

        sets = [*sets, f"env.{PLACEMENT_ENV}={placement_set(placement)}"]
    if restart is not None:
        from sm120.recipe.restart_policy import parse_restart_policy

        # Refused here, before any work; then applied as the command line's last --set.
        sets = [*sets, f"monitor.restart={parse_restart_policy(restart)}"]
    request = _request(recipe, variant, sets, model_dir, port, host, force, env_file, no_think)
    addresses = None
    if nodes is not None:
        from sm120.engine.cluster.hosts import parse_nodes

        addresses = parse_nodes(nodes)
    hardware = declared(count, arch)
    if placement is not None:
        from sm120.deploy.placement import placed_hardware

        hardware = placed_hardware(placement, arch)
    # Nodes of a multi-node plan are checked one by one at launch, not against this machine.
    if hardware is None and not dry_run and addresses is None:
        from sm120.doctor.detect import detect
        from sm120.plan.hardware import Hardware

        hardware = detect() or Hardware(gpus=0, arch="cpu", source="detected")
    _check_runtime(runtime, network)
    checked = checked_plan(request, hardware)
    if placement is not None:
        from sm120.deploy.placement import check_placeable

        check_placeable(checked.plan, placement)
    from sm120.deploy.monitoring import check_restart_policy

    check_restart_policy(checked.plan, monitor=not no_monitor, multinode=addresses is not None)
    launches = _node_launches(checked, addresses, runtime) if addresses is not None else None
    if addresses is None:
        # The weights of a multi-node plan sit at one path on every node: no local default.
        request, checked = _weights_dir(request, checked)
    if dry_run:
        document = plan_document(checked)
        if launches is not None:
            document["nodes"] = [launch.as_dict() for launch in launches]
        if as_json:
            if runtime == "docker" and launches is None:
                document["container"] = _container_preview(checked.plan, name, network)
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
        from sm120.engine.cluster.hosts import require_nodes

        require_nodes(checked.plan)
    checked.raise_on_failure()
    if addresses is not None:
        from sm120.cli.serving import serve
        from sm120.core.errors import SM120Error
        from sm120.deploy.cluster import ClusterRequest
        from sm120.deploy.launcher import LaunchOptions

        if gate_request is not None:
            raise SM120Error("--gate is for one host", "run 'sm120 test' once READY instead")
        options = LaunchOptions(
            name=name or checked.plan.recipe,
            vllm_python=vllm_python,
            api_key=api_key,
            replace=replace,
            timeout_s=timeout,
            monitor=not no_monitor,
        )
        cluster = ClusterRequest(addresses, runtime, tuple(ssh_option))
        raise typer.Exit(serve(checked, options, foreground=foreground, cluster=cluster))
    from sm120.deploy.launcher import preflight_or_stop, running_deployment

    # A second launch of a running deployment is refused before anything long starts.
    replacing = running_deployment(name or checked.plan.recipe, replace) is not None
    # Will it run here at all, before fetching hundreds of GB of weights for it. Declared
    # hardware (--gpus/--arch) replaces what this machine has, so its checks are moot then.
    if placement is not None:
        from sm120.deploy.placement import check_no_overlap

        check_no_overlap(placement, name or checked.plan.recipe)
    passed = None
    if count is None and arch is None:
        passed = preflight_or_stop(checked.plan, None, _progress_line, replacing=replacing)
    checked = _complete_weights(request, checked, yes)
    from sm120.cli.serving import serve
    from sm120.deploy.launcher import LaunchOptions

    options = LaunchOptions(
        name=name or checked.plan.recipe,
        vllm_python=vllm_python,
        api_key=api_key,
        replace=replace,
        timeout_s=timeout,
        confirm=None if yes or not sys.stdin.isatty() else _ask,
        docker_network=network,
        monitor=not no_monitor,
        preflight=passed,
    )
    raise typer.Exit(
        serve(checked, options, runtime=runtime, foreground=foreground, gate=gate_request)
    )


RUNTIMES = ("native", "docker")
NETWORKS = ("bridge", "host")


def _check_runtime(runtime: str, network: str) -> None:
    from sm120.core.errors import SM120Error
    from sm120.core.suggest import did_you_mean

    if runtime not in RUNTIMES:
        raise SM120Error(
            f"unknown runtime '{runtime}'{did_you_mean(runtime, RUNTIMES)}",
            "use --runtime native or --runtime docker",
        )
    if network not in NETWORKS:
        raise SM120Error(
            f"unknown Docker network mode '{network}'{did_you_mean(network, NETWORKS)}",
            "use --network bridge (publish the port) or --network host",
        )


def _container_preview(plan: PlanT, name: str | None, network: str) -> dict[str, object]:
    """The containers.run arguments launch would use; the image id is looked up if Docker is
    reachable, and the API key is never shown (it is generated at launch)."""
    from sm120.deploy.containers import placement
    from sm120.engine import docker_api
    from sm120.render.container import render_container

    image_id = None
    # A dry run must not need Docker: without it the cache path says "unbuilt".
    with contextlib.suppress(docker_api.DockerUnavailable):
        found = docker_api.get_image(docker_api.connect(), plan.image_ref)
        image_id = str(found.id) if found is not None else None
    return render_container(plan, placement(plan, name or plan.recipe, image_id, network, None))


def _weights_dir(request: PlanRequest, checked: CheckedPlan) -> tuple[PlanRequest, CheckedPlan]:
    """With no model dir chosen, a downloadable checkpoint lives in sm120's folder for it."""
    from sm120.deploy.checked import checked_plan
    from sm120.weights.ensure import with_managed_dir

    managed = with_managed_dir(request, checked.plan)
    if managed is None:
        return request, checked
    return managed, checked_plan(managed, checked.hardware)


def _complete_weights(request: PlanRequest, checked: CheckedPlan, yes: bool) -> CheckedPlan:
    """Serve complete weights: fetch what is missing (asking unless --yes), then resolve
    again so values derived from the checkpoint's config.json enter the plan."""
    from sm120.cli.weights import weights_for_launch
    from sm120.deploy.checked import checked_plan

    if weights_for_launch(checked.plan, yes) is None:
        return checked
    again = checked_plan(request, checked.hardware)
    again.raise_on_failure()
    return again


def _gpu_choice(gpus: str | None) -> tuple[int | None, tuple[int, ...] | None]:
    """--gpus as a count (range-checked as every numeric option is) or a GPU set."""
    from sm120.cli.bounds import BOUNDS, check_number
    from sm120.plan.gpu_sets import parse_gpus

    if gpus is None:
        return None, None
    choice = parse_gpus(gpus)
    if choice.count is not None:
        check_number("--gpus", choice.count, BOUNDS["launch --gpus"])
    return choice.count, choice.placement


def _progress_line(line: str) -> None:
    typer.echo(line, err=True)


def _gate_request(
    gate: list[str], keep_on_fail: bool, max_tokens: int | None
) -> GateRequest | None:
    """Checked before anything starts: a typo in a suite name must not cost a model load."""
    from sm120.cli.gates import split_suites
    from sm120.cli.serving import GateRequest
    from sm120.core.errors import SM120Error
    from sm120.measure.cases import builtin_gates, select

    if not gate:
        if keep_on_fail or max_tokens is not None:
            raise SM120Error("--keep-on-fail and --gate-max-tokens need --gate", "e.g. --gate core")
        return None
    suites = split_suites(gate)
    for suite in suites:
        select(builtin_gates(), suite)
    return GateRequest(tuple(suites), keep_on_fail, max_tokens)


def _node_launches(
    checked: CheckedPlan, addresses: list[NodeAddress], runtime: str
) -> list[NodeLaunch]:
    from sm120.engine.cluster.hosts import check_nodes_fit
    from sm120.recipe.loader import load_recipe
    from sm120.render.compose import CONTAINER_MODEL_DIR
    from sm120.render.multinode import render_nodes

    plan = checked.plan
    check_nodes_fit(plan, load_recipe(plan.recipe), addresses)
    docker = runtime == "docker" and plan.model_dir
    return render_nodes(
        plan, addresses, container_model_dir=CONTAINER_MODEL_DIR if docker else None
    )


def _ask(question: str) -> bool:
    return typer.confirm(question, default=True, err=True)
