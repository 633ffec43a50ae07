"""`sm120 connect CLIENT [NAME]`: point Claude Code, Codex or an OpenAI client at this box."""

from __future__ import annotations

import typer

from sm120.cli.errors import cli_errors


def register(root: typer.Typer) -> None:
    root.command("connect")(connect)


@cli_errors
def connect(
    client: str = typer.Argument(..., help="claude-code, codex or openai."),
    name: str | None = typer.Argument(
        None,
        help="The deployment to use (default: the only one running, or the one --model names).",
    ),
    model: str | None = typer.Option(
        None, "--model", help="The model name to ask for (a served model or a gateway alias)."
    ),
    shell: bool = typer.Option(
        False, "--shell", help='Print export lines to eval: eval "$(sm120 connect ... --shell)".'
    ),
    write: bool = typer.Option(
        False,
        "--write",
        help="Write the client's own settings (~/.claude/settings.json, backed up first; "
        "Codex: a profile ~/.codex/sm120.config.toml) and say where.",
    ),
    undo: bool = typer.Option(
        False, "--undo", help="Put back the files --write changed for CLIENT, as they were."
    ),
    show_key: bool = typer.Option(
        False, "--show-key", help="Put the key itself in the output (default: read from its file)."
    ),
    direct: bool = typer.Option(
        False, "--direct", help="Connect to the deployment even when a gateway runs."
    ),
) -> None:
    """The settings a coding agent needs: base URL, key, model names, context window and
    retry bounds (never the key itself unless --show-key)."""
    from sm120.core.errors import SM120Error
    from sm120.gateway.connect import (
        CLIENTS,
        codex_then,
        describe,
        find_endpoint,
        settings_for,
        shell_lines,
        stale_writes,
        warnings_for,
        write_client_config,
    )
    from sm120.gateway.connect_files import home_of_user
    from sm120.gateway.connect_files import undo as undo_writes
    from sm120.gateway.files import gateway_files

    if sum((shell, write, undo)) > 1:
        raise SM120Error("--shell, --write and --undo do not go together", "choose one")
    if undo:
        if client not in CLIENTS:
            raise SM120Error(f"unknown client {client!r}", f"choose one of {', '.join(CLIENTS)}")
        typer.echo("\n".join(undo_writes(client)))
        return
    endpoint = find_endpoint(gateway_files(), name, direct)
    settings = settings_for(client, endpoint, model)
    for warning in warnings_for(settings):
        typer.echo(f"warning: {warning}", err=True)
    if shell:
        typer.echo("\n".join(shell_lines(settings, show_key)))
        return
    if write:
        path, changed = write_client_config(settings, home_of_user())
        typer.echo(f"wrote {path}: {', '.join(changed)}")
        typer.echo(f"undo: sm120 connect {client} --undo")
        if client == "codex":
            typer.echo(f"then: {codex_then()}")
        if show_key:
            typer.echo(f"key: {endpoint.key()}")
        return
    typer.echo("\n".join(describe(settings)))
    for line in stale_writes():
        typer.echo(f"stale: {line}", err=True)
    if show_key:
        typer.echo(f"key: {endpoint.key()}")
