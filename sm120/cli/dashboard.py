"""`sm120 dashboard`: the web dashboard on its own, for a machine that runs no gateway (a
running gateway serves it already, at /dashboard)."""

from __future__ import annotations

import typer

from sm120.cli.errors import cli_errors
from sm120.core.defaults import DEFAULT_HOST

DEFAULT_DASHBOARD_PORT = 8090


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)


@cli_errors
def dashboard(
    port: int = typer.Option(DEFAULT_DASHBOARD_PORT, "--port", help="Port to listen on."),
    host: str = typer.Option(DEFAULT_HOST, "--host", help="Bind address."),
) -> None:
    """Serve the web dashboard (deployments, live figures, GPUs, alerts, bench history)
    behind the gateway's key, until Ctrl-C."""
    from sm120.core.errors import SM120Error
    from sm120.core.net import client_url, exposure_warning
    from sm120.core.ports import ensure_port_free
    from sm120.dashboard.serve import serve_dashboard
    from sm120.gateway.control import gateway_status
    from sm120.gateway.files import ensure_gateway_key, gateway_files
    from sm120.gateway.panel import standalone_controls

    files = gateway_files()
    running = gateway_status(files)
    if running.running:
        address = running.address
        where = client_url(address.host, address.port, "/dashboard") if address else "it"
        raise SM120Error(
            "the gateway serves the dashboard already", f"open {where} (sm120 gateway status)"
        )
    ensure_port_free(host, port)
    api_key = ensure_gateway_key(files)
    warning = exposure_warning(host)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(
        f"dashboard at {client_url(host, port, '/dashboard')}; sign in with the key in "
        f"{files.api_key} (Ctrl-C stops it)",
        err=True,
    )
    serve_dashboard(host, port, api_key, standalone_controls)
