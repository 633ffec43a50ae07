"""`sm120 connect CLIENT [NAME]`: point Claude Code, Codex or an OpenAI client at this box."""

from __future__ import annotations

from pathlib import Path

import typer

from sm120.cli.errors import cli_errors


def register(root: typer.Typer) -> None:
    root.command("connect")(connect)


@cli_errors
def connect(
    client: str = typer.Argument(..., help="claude-code, codex or openai."),
    name: str | None = typer.Argument(
        None, help="The deployment to use (default: the only one, or every one the gateway serves)."
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
        help="Write the client's own config file (~/.claude, ~/.codex) and say where.",
    ),
    show_key: bool = typer.Option(
        False, "--show-key", help="Put the key itself in the output (default: read from its file)."
    ),
    direct: bool = typer.Option(
        False, "--direct", help="Connect to the deployment even when a gateway runs."
    ),
) -> None:
    """The settings a coding agent needs: base URL, key, model names (never the key itself
    unless --show-key)."""
    from sm120.core.errors import SM120Error
    from sm120.gateway.connect import (
        codex_provider,
        describe,
        find_endpoint,
        settings_for,
        shell_lines,
        write_client_config,
    )
    from sm120.gateway.files import gateway_files

    if shell and write:
        raise SM120Error("--shell and --write do not go together", "choose one")
    endpoint = find_endpoint(gateway_files(), name, direct)
    settings = settings_for(client, endpoint, model)
    if shell:
        typer.echo("\n".join(shell_lines(settings, show_key)))
        if client == "codex":
            typer.echo(codex_provider(settings).rstrip(), err=True)
        return
    if write:
        path, changed = write_client_config(settings, Path.home())
        typer.echo(f"wrote {path}: {', '.join(changed)}")
        if client == "codex":
            typer.echo(f'then: export SM120_API_KEY="$(cat {endpoint.key_file})"; codex')
        return
    typer.echo("\n".join(describe(settings)))
    if show_key:
        typer.echo(f"key: {endpoint.key()}")
