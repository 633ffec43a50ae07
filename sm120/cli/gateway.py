"""`sm120 gateway start|stop|status|keys|usage|analyze`: one OpenAI-compatible endpoint for
every deployment, keys per person, who used what, and what breaks the prefix cache."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import typer

from sm120.cli.errors import cli_errors
from sm120.gateway.config import (
    DEFAULT_BUSY_SHARE,
    DEFAULT_FIRST_TOKEN_HOLD_S,
    DEFAULT_HOST,
    DEFAULT_MAX_AWAKE,
    DEFAULT_PORT,
    DEFAULT_SWAP_WAIT_S,
)

app = typer.Typer(
    help="One OpenAI-compatible endpoint in front of every deployment, routing by 'model'.",
    no_args_is_help=True,
)


keys_app = typer.Typer(
    help="Keys per person: each with its models and limits, stored only as keyed hashes.",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="keys")


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
    no_usage: bool = typer.Option(
        False, "--no-usage", help="Do not record each request's usage in usage.db."
    ),
    request_log: bool = typer.Option(
        False,
        "--request-log",
        help="Log each request's prompt structure (lengths and hashes, no text) for "
        "'sm120 gateway analyze'.",
    ),
    busy_share: float = typer.Option(
        DEFAULT_BUSY_SHARE,
        "--busy-share",
        help="Fair turns: the part of an engine's --max-num-seqs slots one key may hold while "
        "another key is busy on it (0.5: 32 of 64).",
    ),
    first_token_hold: float = typer.Option(
        DEFAULT_FIRST_TOKEN_HOLD_S,
        "--first-token-hold",
        help="Fair turns: seconds at most that a busier key's new requests wait while "
        "another key's request waits for its first token (0: off).",
    ),
) -> None:
    """Start the gateway (detached unless --foreground); a running one is left as it is."""
    from sm120.core.net import client_url, exposure_warning
    from sm120.core.ports import ensure_port_free
    from sm120.gateway.aliases import AliasTable, load_alias_file, merged, parse_alias
    from sm120.gateway.config import GatewayConfig, TurnPolicy
    from sm120.gateway.control import check_config, start_gateway
    from sm120.gateway.files import ensure_gateway_key, gateway_files
    from sm120.gateway.server import serve

    files = gateway_files()
    from_file = aliases_file or files.aliases
    file_aliases = load_alias_file(from_file) if aliases_file or from_file.exists() else []
    chosen = merged(file_aliases, [parse_alias(text) for text in alias])
    AliasTable(chosen)  # the file and --alias together within the bound, said here in one line
    config = GatewayConfig(
        host, port, max_awake, swap_wait, aliases=chosen, normalize_prompts=normalize_prompts,
        record_usage=not no_usage, request_log=request_log,
        turns=TurnPolicy(busy_share, first_token_hold),
    )  # fmt: skip
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


@keys_app.command("add")
@cli_errors
def keys_add(
    name: str = typer.Argument(..., help="Whose key (letters, digits, . _ @ -)."),
    models: str | None = typer.Option(
        None, "--models", help="Models it may use: comma-separated patterns ('tiny-*,glm47')."
    ),
    rpm: int | None = typer.Option(None, "--rpm", help="Requests per minute."),
    tpm: int | None = typer.Option(None, "--tpm", help="Tokens (prompt + completion) per minute."),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="Requests in flight at once."
    ),
    expires: str | None = typer.Option(
        None, "--expires", help="Last day it works, YYYY-MM-DD (UTC)."
    ),
) -> None:
    """Add a key and print it, once: only its keyed hash is kept."""
    from sm120.gateway.files import gateway_files
    from sm120.gateway.keys import (
        KeyEntry,
        KeyStore,
        add_key,
        check_expires,
        check_limit,
        check_name,
    )

    entry = KeyEntry(
        check_name(name), "", _models(models), check_limit("--rpm", rpm),
        check_limit("--tpm", tpm), check_limit("--concurrency", concurrency),
        check_expires(expires),
    )  # fmt: skip
    key = add_key(KeyStore(gateway_files().root), entry)
    typer.echo(key)
    typer.echo(f"added key '{name}' (shown once: hand it over now)", err=True)


def _models(text: str | None) -> str | None:
    from sm120.gateway.keys import KeyError_

    if text is None:
        return None
    patterns = [p.strip() for p in text.split(",")]
    if not all(patterns) or any(not p.isprintable() for p in patterns):
        raise KeyError_(
            f"--models '{text.encode('unicode_escape').decode()[:80]}' has an empty or "
            "unprintable pattern",
            "give comma-separated model names or patterns, e.g. 'tiny-*,glm47'",
        )
    return ",".join(patterns)


@keys_app.command("list")
@cli_errors
def keys_list(as_json: bool = typer.Option(False, "--json", help="JSON on stdout.")) -> None:
    """Every key's name, models, limits and expiry (never the key)."""
    from sm120.core.terminal import terminal_safe
    from sm120.gateway.files import gateway_files
    from sm120.gateway.keys import KeyStore, describe

    entries = KeyStore(gateway_files(create=False).root).entries()
    if as_json:
        typer.echo(json.dumps([describe(e) for e in entries], indent=2))
        return
    if not entries:
        typer.echo("no keys but the gateway's own (add one: sm120 gateway keys add NAME)")
        return
    for entry in entries:
        models = entry.models or "every model"
        expires = f", expires after {entry.expires}" if entry.expires else ""
        typer.echo(terminal_safe(f"{entry.name:<20} {models}; limits: {entry.limits()}{expires}"))


@keys_app.command("revoke")
@cli_errors
def keys_revoke(name: str = typer.Argument(..., help="The key's name.")) -> None:
    """Remove a key; a running gateway refuses it within a second."""
    from sm120.core.terminal import terminal_safe
    from sm120.gateway.files import gateway_files
    from sm120.gateway.keys import KeyStore, revoke_key

    revoke_key(KeyStore(gateway_files().root), name)
    typer.echo(terminal_safe(f"revoked key '{name}'"))


@keys_app.command("rotate")
@cli_errors
def keys_rotate(name: str = typer.Argument(..., help="The key's name.")) -> None:
    """A new key for NAME (same models and limits), printed once; the old one stops working."""
    from sm120.gateway.files import gateway_files
    from sm120.gateway.keys import KeyStore, rotate_key

    typer.echo(rotate_key(KeyStore(gateway_files().root), name))
    typer.echo("rotated (shown once: hand it over now; the old key no longer works)", err=True)


@app.command("usage")
@cli_errors
def usage(
    by: str = typer.Option("key", "--by", help="Group by key, model, day or protocol."),
    since: str | None = typer.Option(
        None, "--since", help="From this day (YYYY-MM-DD) or this long ago (30m, 12h, 7d)."
    ),
    as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
) -> None:
    """Requests, tokens, errors and mean TTFT per key, model or day, from usage.db."""
    from sm120.gateway.files import gateway_files
    from sm120.gateway.usage_view import render_usage, usage_rows

    rows = usage_rows(gateway_files(create=False).usage_db, by, since)
    typer.echo(json.dumps(rows, indent=2) if as_json else render_usage(rows, by))


@app.command("analyze")
@cli_errors
def analyze(
    key: str | None = typer.Option(None, "--key", help="Only this key's sessions."),
    as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
) -> None:
    """What changes between one turn and the next of each session in the request log, and
    the prefix-cache hit rate it costs (against the engines' own counters)."""
    from sm120.gateway.analyze import analyze_log, render_analysis
    from sm120.gateway.files import gateway_files

    report = analyze_log(gateway_files(create=False).request_log, key)
    typer.echo(json.dumps(report, indent=2) if as_json else render_analysis(report))

    if not as_json:
        from sm120.core.errors import SM120Error
        from sm120.gateway.connect import stale_writes

        # A client set up for a context window the deployment no longer has; an unreadable
        # record is connect's to report, not the gateway's.
        with contextlib.suppress(SM120Error):
            for line in stale_writes():
                typer.echo(f"stale: {line}", err=True)
