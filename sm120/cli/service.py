"""`sm120 service print|install|uninstall NAME [launch options]`: a systemd unit per deployment.

The launch options are parsed by `sm120 launch`'s own definition, so the unit carries
exactly what `sm120 launch` would accept; the unit itself comes from sm120.deploy.service.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sm120.cli.errors import cli_errors

if TYPE_CHECKING:
    from sm120.deploy.service import ServiceRequest

app = typer.Typer(
    help="Run a deployment as a systemd service (sm120 launch --foreground under systemd).",
    no_args_is_help=True,
)

# Launch options after NAME are passed through untouched (and checked by launch's parser).
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
ServedRecipeArg = Annotated[str, typer.Argument(help="Recipe to serve, as for 'sm120 launch'.")]
SystemOpt = Annotated[
    bool,
    typer.Option(
        "--system", help="A system unit in /etc/systemd/system (root) instead of a user unit."
    ),
]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="service")


def _launch_params(recipe: str, args: list[str]) -> dict[str, Any]:
    """What `sm120 launch RECIPE ARGS` would parse ARGS into; its errors, as one line. The
    values pass launch's own checks too (ranges, host, gate suites): a unit must never carry
    options that `sm120 launch` would refuse when systemd starts it."""
    from sm120.cli.bounds import check_options, numeric_options
    from sm120.cli.launch import launch
    from sm120.core.errors import SM120Error
    from sm120.core.net import check_host
    from sm120.deploy.gate import gate_request
    from sm120.deploy.service import refuse_uncarried

    refuse_uncarried([arg.split("=", 1)[0] for arg in args if arg.startswith("-")])
    command = typer.main.get_command(_single(launch))
    try:
        with command.make_context("launch", [recipe, *args]) as context:
            params = dict(context.params)
    except typer.exceptions.TyperException as exc:  # click's usage errors, as typer ships it
        raise SM120Error(f"not a launch option: {exc}", "see 'sm120 launch --help'") from None
    check_options(launch.__name__, numeric_options(launch), params)
    if params.get("host") is not None:
        check_host(params["host"])
    gate_request(params["gate"], params["keep_on_fail"], params["gate_max_tokens"])
    return params


def _single(function: Any) -> typer.Typer:
    one = typer.Typer()
    one.command()(function)
    return one


def _service_request(recipe: str, args: list[str], system: bool) -> ServiceRequest:
    import os
    import sys

    from sm120.core.defaults import DEFAULT_ENV_FILE
    from sm120.core.paths import sm120_home
    from sm120.deploy.service import ServiceRequest
    from sm120.deploy.session import check_runtime
    from sm120.engine.state import check_deployment_name
    from sm120.plan.request import plan_request
    from sm120.plan.resolve import resolve

    params = _launch_params(recipe, args)
    check_runtime(params["runtime"], params["network"])
    deployment = check_deployment_name(params["name"] or recipe)
    request = plan_request(
        recipe,
        environ=os.environ,
        variants=params["variant"],
        sets=params["sets"],
        model_dir=params["model_dir"],
        port=params["port"],
        host=params["host"],
        no_think=params["no_think"],
        force=params["force"],
        env_file=params["env_file"],
    )
    plan = resolve(request)
    env_file = params["env_file"] or (DEFAULT_ENV_FILE if DEFAULT_ENV_FILE.is_file() else None)
    return ServiceRequest(
        deployment=deployment,
        recipe=plan.recipe,
        variants=tuple(plan.variants),
        executable=(sys.executable, "-m", "sm120"),
        launch_args=tuple(arg for arg in args if arg != "--foreground"),
        runtime=params["runtime"],
        ready_timeout_s=params["timeout"] or plan.timeouts.ready_s,
        home=str(sm120_home().resolve()),
        working_dir=str(Path.cwd()),
        env_file=str(Path(env_file).resolve()) if env_file else None,
        system=system,
    )


@app.command("print", context_settings=PASSTHROUGH)
@cli_errors
def print_unit(
    context: typer.Context,
    recipe: ServedRecipeArg,
    system: SystemOpt = False,
) -> None:
    """Print the unit for `sm120 launch NAME [launch options]`; writes nothing."""
    from sm120.deploy.service import render_unit

    typer.echo(render_unit(_service_request(recipe, list(context.args), system)), nl=False)


@app.command("install", context_settings=PASSTHROUGH)
@cli_errors
def install(
    context: typer.Context,
    recipe: ServedRecipeArg,
    system: SystemOpt = False,
    now: bool = typer.Option(False, "--now", help="Also run the systemctl commands it prints."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print path and unit; write nothing."),
) -> None:
    """Write the unit (0644), then print the systemctl commands that start it."""
    import os

    from sm120.deploy.service import (
        check_system_install,
        install_unit,
        render_unit,
        systemctl_commands,
        unit_dir,
        unit_name,
    )

    request = _service_request(recipe, list(context.args), system)
    path = unit_dir(system) / unit_name(request.deployment)
    text = render_unit(request)
    commands = systemctl_commands(request.deployment, system)
    if dry_run:
        typer.echo(f"would write {path}:")
        typer.echo(text, nl=False)
        typer.echo(f"then run: {' && '.join(commands)}")
        return
    check_system_install(system, os.geteuid())
    install_unit(path, text)
    typer.echo(f"wrote {path}")
    _start_or_say(commands, now)


@app.command("uninstall")
@cli_errors
def uninstall(
    deployment: str = typer.Argument(..., help="Deployment name (the recipe unless --name)."),
    system: SystemOpt = False,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be removed."),
) -> None:
    """Remove a unit sm120 wrote, once disabled (systemctl disable --now first)."""
    import os

    from sm120.deploy.service import (
        check_system_install,
        disable_command,
        is_ours,
        systemctl_commands,
        uninstall_unit,
        unit_dir,
        unit_name,
    )

    path = unit_dir(system) / unit_name(deployment)
    disable = disable_command(deployment, system)
    reload = systemctl_commands(deployment, system)[0]
    if dry_run:
        what = "would remove" if is_ours(path) else "would refuse to remove"
        typer.echo(f"{what} {path} (stop and disable it first: {disable})")
        return
    check_system_install(system, os.geteuid())
    uninstall_unit(path, disable)
    typer.echo(f"removed {path}; now run: {reload}")


def _start_or_say(commands: list[str], now: bool) -> None:
    import shlex
    import shutil
    import subprocess

    if not now:
        typer.echo(f"start it: {' && '.join(commands)}")
        return
    from sm120.core.errors import SM120Error

    if shutil.which("systemctl") is None:
        raise SM120Error("systemctl not found", f"run yourself: {' && '.join(commands)}")
    for command in commands:
        typer.echo(f"running: {command}", err=True)
        if subprocess.run(shlex.split(command), check=False).returncode != 0:
            raise SM120Error(f"'{command}' failed", "see its message above; the unit is written")
