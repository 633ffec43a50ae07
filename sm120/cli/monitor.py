"""`sm120 monitor`: the live view, the throughput plot, and the monitor service itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sm120.cli.errors import cli_errors
from sm120.cli.options import DeploymentOpt
from sm120.core.errors import SM120Error

if TYPE_CHECKING:
    from sm120.monitor.files import MonitorFiles


def register(app: typer.Typer) -> None:
    app.command("monitor")(monitor)


class MonitorUsage(SM120Error):
    """Options that do not go together."""


def _check_options(
    plot: Path | None, serve: bool, url: str | None, state_dir: Path | None, name: str | None
) -> None:
    if plot is not None and serve:
        raise MonitorUsage(
            "--plot and --serve do not go together",
            "draw the plot with 'sm120 monitor --plot OUT' while the service runs",
        )
    if (url or state_dir) and not serve:
        raise MonitorUsage("--url and --state-dir only go with --serve", "add --serve")
    if serve and bool(url) != bool(state_dir):
        raise MonitorUsage(
            "--serve --url needs --state-dir (and --state-dir needs --url)",
            "e.g. --serve --url http://127.0.0.1:8000 --state-dir ./monitor-state",
        )
    if url and name:
        raise MonitorUsage(
            "--name and --url do not go together", "--name for a deployment, --url for a server"
        )


def _files_of(name: str | None) -> tuple[str, MonitorFiles]:
    """A deployment's monitor files; a stopped deployment keeps its history and peaks."""
    from sm120.engine.find import NoDeployment, find_deployment
    from sm120.engine.state import deployment_path
    from sm120.monitor.files import MonitorFiles

    if name:
        root = deployment_path(name)
        if not root.is_dir():
            raise NoDeployment(
                f"no deployment named '{name}'",
                "'sm120 status' lists them; start one with 'sm120 launch'",
            )
        return name, MonitorFiles(root)
    state = find_deployment(None)
    return state.name, MonitorFiles(deployment_path(state.name))


@cli_errors
def monitor(
    name: DeploymentOpt = None,
    plot: Path | None = typer.Option(
        None, "--plot", help="Draw throughput over time into OUT (.png/.svg/.pdf) and exit."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the latest view as JSON and exit."),
    once: bool = typer.Option(False, "--once", help="Print the view once instead of live."),
    serve: bool = typer.Option(
        False, "--serve", help="Run the monitor service in the foreground (launch starts it)."
    ),
    url: str | None = typer.Option(
        None, "--url", help="With --serve: watch a server by address (compose)."
    ),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="With --serve --url: where the monitor writes its files."
    ),
) -> None:
    """Live view of the server: phase, tok/s now and peak, queue, KV, watchdog, alerts."""
    _check_options(plot, serve, url, state_dir, name)
    if serve:
        from sm120.monitor.process import serve as serve_monitor

        if url and state_dir:
            from sm120.monitor.files import MonitorFiles

            raise typer.Exit(serve_monitor(None, MonitorFiles(state_dir), url=url))
        from sm120.deploy.cluster_monitor import serve_deployment

        deployment, files = _files_of(name)
        raise typer.Exit(serve_deployment(deployment, files))
    deployment, files = _files_of(name)
    if plot is not None:
        from sm120.monitor.peaks import JsonlRing
        from sm120.monitor.plot import check_plot_path, plot_history

        check_plot_path(plot)
        count = plot_history(JsonlRing(files.history).read(), plot, deployment)
        typer.echo(f"wrote {plot} ({count} samples)", err=True)
        return
    _show(deployment, files, as_json=as_json, once=once)


def _show(deployment: str, files: MonitorFiles, *, as_json: bool, once: bool) -> None:
    from rich.console import Console

    from sm120.monitor.process import running_monitor
    from sm120.monitor.view import read_live, render, watch

    live = read_live(files)
    if live is None:
        raise SM120Error(
            f"the monitor has published nothing for '{deployment}' yet",
            f"it starts with 'sm120 launch'; start one by hand: sm120 monitor --serve "
            f"--name {deployment}",
        )
    if as_json:
        typer.echo(json.dumps(live, indent=2, sort_keys=True))
        return
    console = Console()
    if once or not console.is_terminal:
        console.print(render(live, deployment, running_monitor(files)))
        return
    watch(files, deployment, console)
