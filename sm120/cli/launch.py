"""`sm120 launch NAME`: parse the options into one `LaunchRequest` and hand it to
sm120.deploy.session, which previews (--dry-run) or serves it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sm120.cli.errors import cli_errors
from sm120.cli.options import (
    EnvFileOpt,
    HostOpt,
    ModelDirOpt,
    PortOpt,
    SetsOpt,
    VariantsOpt,
    VllmPythonOpt,
)

if TYPE_CHECKING:
    from sm120.deploy.session import LaunchRequest


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)


@cli_errors
def launch(
    recipe: str = typer.Argument(..., help="Recipe to serve, e.g. glm52 (see 'sm120 recipes')."),
    variant: VariantsOpt = [],  # noqa: B006 - Typer copies it
    sets: SetsOpt = [],  # noqa: B006
    model_dir: ModelDirOpt = None,
    port: PortOpt = None,
    host: HostOpt = None,
    force: list[str] = typer.Option([], "--force", help="Skip a rule by id (recorded)."),
    env_file: EnvFileOpt = None,
    no_think: bool = typer.Option(False, "--no-think", help="Reasoning off (recipe allowing)."),
    gpus: str | None = typer.Option(
        None,
        "--gpus",
        help="N: check against N GPUs, not detected. 0,1 or device=3: run on these GPUs.",
    ),
    arch: str | None = typer.Option(None, "--arch", help="Check against this arch (sm_120)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; start nothing."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="JSON on stdout: the plan (--dry-run), or the result with its wall-time split.",
    ),
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
    vllm_python: VllmPythonOpt = None,
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
    no_tuned: bool = typer.Option(
        False, "--no-tuned", help="Leave the settings 'sm120 tune' found on this host aside."
    ),
) -> None:
    """Resolve the plan, run the rules, and serve (or only print the plan with --dry-run)."""
    from sm120.cli.serving import TerminalView
    from sm120.deploy.session import launch as launch_session

    request = launch_request(
        recipe=recipe,
        variant=variant,
        sets=sets,
        model_dir=model_dir,
        port=port,
        host=host,
        force=force,
        env_file=env_file,
        no_think=no_think,
        gpus=gpus,
        arch=arch,
        dry_run=dry_run,
        runtime=runtime,
        network=network,
        nodes=nodes,
        ssh_option=ssh_option,
        name=name,
        vllm_python=vllm_python,
        api_key=api_key,
        replace=replace,
        foreground=foreground,
        timeout=timeout,
        yes=yes,
        no_monitor=no_monitor,
        restart=restart,
        gate=gate,
        keep_on_fail=keep_on_fail,
        gate_max_tokens=gate_max_tokens,
        no_tuned=no_tuned,
    )
    from sm120 import IMPORTED_AT

    # The split in --json starts when the command did, its imports counted.
    raise typer.Exit(launch_session(request, TerminalView(as_json=as_json), IMPORTED_AT))


def launch_request(
    *,
    recipe: str,
    variant: list[str],
    sets: list[str],
    model_dir: str | None,
    port: int | None,
    host: str | None,
    force: list[str],
    env_file: Path | None,
    no_think: bool,
    gpus: str | None,
    arch: str | None,
    dry_run: bool,
    runtime: str,
    network: str,
    nodes: str | None,
    ssh_option: list[str],
    name: str | None,
    vllm_python: str | None,
    api_key: str | None,
    replace: bool,
    foreground: bool,
    timeout: float | None,
    yes: bool,
    no_monitor: bool,
    restart: str | None,
    gate: list[str],
    keep_on_fail: bool,
    gate_max_tokens: int | None,
    no_tuned: bool = False,
) -> LaunchRequest:
    """The options as one request, each refused here when it is malformed (before any
    work): the gate's suites, --gpus, --restart, the .env file, --nodes."""
    from sm120.deploy.gate import gate_request
    from sm120.deploy.session import LaunchRequest
    from sm120.engine.cluster.hosts import parse_nodes
    from sm120.plan.request import plan_request

    gate_wanted = gate_request(gate, keep_on_fail, gate_max_tokens)
    count, placement = _gpu_choice(gpus)
    if placement is not None:
        from sm120.plan.gpu_sets import PLACEMENT_ENV, placement_set

        sets = [*sets, f"env.{PLACEMENT_ENV}={placement_set(placement)}"]
    if restart is not None:
        from sm120.recipe.restart_policy import parse_restart_policy

        # Refused here, before any work; then applied as the command line's last --set.
        sets = [*sets, f"monitor.restart={parse_restart_policy(restart)}"]
    request = plan_request(
        recipe,
        environ=os.environ,
        variants=variant,
        sets=sets,
        model_dir=model_dir,
        port=port,
        host=host,
        no_think=no_think,
        force=force,
        env_file=env_file,
    )
    return LaunchRequest(
        plan=request,
        name=name,
        gpu_count=count,
        placement=placement,
        arch=arch,
        dry_run=dry_run,
        runtime=runtime,
        network=network,
        nodes=tuple(parse_nodes(nodes)) if nodes is not None else None,
        ssh_options=tuple(ssh_option),
        vllm_python=vllm_python,
        api_key=api_key,
        replace=replace,
        foreground=foreground,
        timeout_s=timeout,
        yes=yes,
        monitor=not no_monitor,
        gate=gate_wanted,
        use_tuned=not no_tuned,
    )


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
