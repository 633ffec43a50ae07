"""`sm120 gateway start|stop|status`: one OpenAI-compatible endpoint for every deployment."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import typer

from sm120.cli.errors import cli_errors
from sm120.gateway.config import (
    DEFAULT_HOST,
    DEFAULT_MAX_AWAKE,
    DEFAULT_PORT,
    DEFAULT_SWAP_WAIT_S,
)

app = typer.Typer(
    help="One OpenAI-compatible endpoint in front of every deployment, routing by 'model'.",
    no_args_is_help=True,
)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="gateway")


@app.command("start")
@cli_errors
def start(
    port: int = typer.Option(DEFAULT_PORT, "--port", help="Port to listen on."),
    host: str = typer.Option(DEFAULT_HOST, "--host", help="Bind address."),
    max_awake: int = typer.Option(
        DEFAULT_MAX_AWAKE,
        "--max-awake",
        help="How many deployments fit at once; asking for another swaps (0: never swap).",
    ),
    swap_wait: float = typer.Option(
        DEFAULT_SWAP_WAIT_S, "--swap-wait", help="Seconds a request waits for a swap (then 503)."
    ),
    foreground: bool = typer.Option(
        False, "--foreground", help="Serve in this process until Ctrl-C/SIGTERM."
    ),
    alias: list[str] = typer.Option(
        [],
        "--alias",
        help="NAME=DEPLOYMENT: requests for model NAME (wildcards allowed: 'claude-*') reach "
        "that deployment. Repeatable; over --aliases.",
    ),
    aliases_file: Path | None = typer.Option(
        None,
        "--aliases",
        help="YAML file 'aliases: {NAME: DEPLOYMENT}' (default: aliases.yaml in the "
        "gateway's state folder, when it exists).",
    ),
    normalize_prompts: bool = typer.Option(
        False,
        "--normalize-prompts",
        help="Make agent prompts cache-friendly: drop Claude Code's per-request billing "
        "header, sort tools by name (docs/gateway.md, 'Prompt normalisation').",
    ),
) -> None:
    """Start the gateway (detached unless --foreground); a running one is left as it is."""
    from sm120.core.net import client_url, exposure_warning
    from sm120.core.ports import ensure_port_free
    from sm120.gateway.aliases import AliasTable, load_alias_file, merged, parse_alias
    from sm120.gateway.config import GatewayConfig
    from sm120.gateway.control import check_config, start_gateway
    from sm120.gateway.files import ensure_gateway_key, gateway_files
    from sm120.gateway.server import serve

    files = gateway_files()
    from_file = aliases_file or files.aliases
    file_aliases = load_alias_file(from_file) if aliases_file or from_file.exists() else []
    chosen = merged(file_aliases, [parse_alias(text) for text in alias])
    AliasTable(chosen)  # the file and --alias together within the bound, said here in one line
    config = GatewayConfig(
        host, port, max_awake, swap_wait, aliases=chosen, normalize_prompts=normalize_prompts
    )
    if not foreground:
        started = start_gateway(config, files)
        if started.warning:
            typer.echo(f"warning: {started.warning}", err=True)
        typer.echo(started.describe())
        return
    config = check_config(config)
    ensure_port_free(config.host, config.port)
    ensure_gateway_key(files)
    warning = exposure_warning(config.host)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(
        f"gateway serving {client_url(config.host, config.port, '/v1')}; clients send the key "
        f"in {files.api_key} (Ctrl-C stops it)",
        err=True,
    )
    serve(config, files)


@app.command("stop")
@cli_errors
def stop() -> None:
    """Stop the gateway this machine runs (the deployments behind it keep running)."""
    from sm120.gateway.control import stop_gateway
    from sm120.gateway.files import gateway_files

    pid = stop_gateway(gateway_files(create=False))
    typer.echo("no gateway was running" if pid is None else f"stopped the gateway (pid {pid})")


@app.command("status")
@cli_errors
def status(as_json: bool = typer.Option(False, "--json", help="JSON on stdout.")) -> None:
    """Whether the gateway runs, where, and where its key is."""
    from sm120.gateway.control import gateway_status
    from sm120.gateway.files import gateway_files

    current = gateway_status(gateway_files(create=False))
    typer.echo(json.dumps(current.as_dict(), indent=2) if as_json else current.describe())
    if not as_json:
        from sm120.core.errors import SM120Error
        from sm120.gateway.connect import stale_writes

        # A client set up for a context window the deployment no longer has; an unreadable
        # record is connect's to report, not the gateway's.
        with contextlib.suppress(SM120Error):
            for line in stale_writes():
                typer.echo(f"stale: {line}", err=True)
