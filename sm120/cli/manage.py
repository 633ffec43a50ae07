"""`sm120 status`, `sm120 logs`, `sm120 stop`: find the deployment through the state dir."""

from __future__ import annotations

import json
import sys

import typer

from sm120.cli import logs_parse
from sm120.cli.errors import cli_errors
from sm120.cli.options import DeploymentOpt, NameAsArgumentOpt
from sm120.core.defaults import STOP_TIMEOUT_S
from sm120.core.errors import SM120Error

# `sm120 logs` shows the log; `sm120 logs parse FILE` reads events from any log.
logs_app = typer.Typer()


# How far back `logs -n N` reads for N lines of the engine's own while polls are hidden: an
# idle server logs two polls every few seconds and nothing else.
POLL_LOOKBACK_MAX = 200_000


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.add_typer(logs_app, name="logs")
    app.command("stop")(stop)


def _one_name(argument: str | None, option: str | None) -> str | None:
    """`sm120 stop NAME` and `sm120 stop --name NAME` both work; both at once must agree."""
    if argument and option and argument != option:
        raise SM120Error(
            f"two deployments named: '{argument}' and --name '{option}'", "give one of them"
        )
    return argument or option


@cli_errors
def status(
    deployment: str | None = typer.Argument(None, help="Deployment (default: all)."),
    name: NameAsArgumentOpt = None,
    as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
) -> None:
    """What runs, since when, where, and how healthy it is."""
    from sm120.deploy.status import describe
    from sm120.engine.find import find_deployment
    from sm120.engine.state import list_states
    from sm120.gateway.control import gateway_status
    from sm120.gateway.files import gateway_files

    name = _one_name(deployment, name)
    # Folders status will not read (a link out of the state tree) are named, not hidden.
    skipped: dict[str, str] = {}
    states = [find_deployment(name)] if name else list_states(skipped)
    rows = [describe(state) for state in states]
    # The gateway is listed with every deployment, and only while it runs.
    gateway = gateway_status(gateway_files(create=False)) if not name else None
    if as_json:
        extra = [gateway.as_dict()] if gateway and gateway.running else []
        unread = [{"name": n, "skipped": why} for n, why in skipped.items()]
        typer.echo(json.dumps(rows + unread + extra, indent=2))
        return
    if not rows and not skipped:
        typer.echo("nothing is deployed (start one: sm120 launch tiny)")
    for row in rows:
        typer.echo(_status_text(row))
    for skipped_name, why in skipped.items():
        typer.echo(f"{skipped_name}  (not read)\n  skipped   {why}")
    if gateway and gateway.running:
        typer.echo(gateway.describe())


def _or_unknown(value: object, form: str = "{}") -> str:
    # The engine wrote NaN or an infinity (status.parse_gauges): a value nobody knows.
    return "unknown" if value is None else form.format(value)


def _status_text(row: dict[str, object]) -> str:
    lines = [f"{row['name']}  ({row['recipe']}, {row['runtime']} runtime, plan {row['plan_hash']})"]
    if row["running"]:
        if row.get("container"):
            where = f"container {row['container']} "
        else:
            where = f"pid {row['pid']} " if row["pid"] else ""
        lines.append(f"  running   {where}since {row['since']} ({row['uptime']})")
        nodes = row.get("nodes")
        if isinstance(nodes, list) and nodes:
            lines.append(f"  nodes     {', '.join(map(str, nodes))} (head first)")
        lines.append(f"  endpoint  {row['endpoint']}  model: {row['served_model_name']}")
        health = row["health"]
        lines.append(f"  health    {'200 OK' if health == 200 else health or 'not answering'}")
        if row.get("key_problem"):
            lines.append(f"  key       {row['key_problem']}")
        if "kv_cache_usage_pct" in row:
            lines.append(
                f"  KV usage  {_or_unknown(row['kv_cache_usage_pct'], '{:.1f}%')}  running "
                f"{_or_unknown(row.get('requests_running'))}, "
                f"waiting {_or_unknown(row.get('requests_waiting'))}"
            )
        if row.get("prefix_cache_hit_pct") is not None:
            lines.append(
                f"  prefix    {row['prefix_cache_hit_pct']:.1f}% of "
                f"{row['prefix_cache_queried_tokens']:,} prompt tokens from the cache "
                "since start"
            )
    elif row.get("stale"):
        lines.append(
            f"  gone      no end was recorded and process {row['supervisor_pid']} is not one "
            f"sm120 started (stale state: 'sm120 stop {row['name']}' clears it)"
        )
    else:
        lines.append(f"  dead      the engine {row['exit']} at {row['ended']}")
        lines.append(f"  log       {row['log_path']}  (sm120 logs --name {row['name']})")
    summary = row.get("monitor")
    if isinstance(summary, dict):
        from sm120.monitor.summary import summary_lines

        lines += summary_lines(summary)
    return "\n".join(lines)


@logs_app.callback(invoke_without_command=True)
@cli_errors
def logs(
    ctx: typer.Context,
    name: DeploymentOpt = None,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    lines: int = typer.Option(50, "--lines", "-n", help="How many last lines to show first."),
    polls: bool = typer.Option(
        False, "--polls", help="Also show the monitor's own GET /health and /metrics lines."
    ),
    gateway: bool = typer.Option(
        False,
        "--gateway",
        help="The gateway's access log instead: a line per request (its own 401s and 404s "
        "included) and its starts, stops, swaps and refusals.",
    ),
) -> None:
    """The engine's log (the file in the deployment's state dir)."""
    if ctx.invoked_subcommand is not None:
        return
    if gateway:
        _gateway_log(lines, follow)
        return
    from sm120.deploy.status import tail_lines
    from sm120.engine.find import find_deployment, runtime_for
    from sm120.logs.polls import is_poll_line

    state = find_deployment(name)
    tail, count = tail_lines(state.log_path, lines)
    shown = tail
    # With polls hidden, read further back (bounded) until -n N finds N lines of the engine's.
    window = lines
    while not polls:
        shown = [line for line in tail if not is_poll_line(line)]
        if len(shown) >= lines or len(tail) < window or window >= POLL_LOOKBACK_MAX:
            break
        window = min(window * 8, POLL_LOOKBACK_MAX)
        tail, count = tail_lines(state.log_path, window)
    for line in shown[-lines:] if lines else []:
        sys.stdout.write(line + "\n")
    if not follow:
        return
    runtime = runtime_for(state)
    try:
        for line in runtime.follow(state, from_line=count):
            if not polls and is_poll_line(line):
                continue
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return


def _gateway_log(lines: int, follow: bool) -> None:
    from sm120.core.errors import SM120Error
    from sm120.deploy.status import tail_lines
    from sm120.engine.runtime.native import follow_log
    from sm120.gateway.files import gateway_files

    path = gateway_files(create=False).access_log
    if not path.is_file():
        raise SM120Error(
            f"no gateway access log at {path}",
            "the gateway writes it once it runs: sm120 gateway start",
        )
    tail, count = tail_lines(str(path), lines)
    for line in tail[-lines:] if lines else []:
        sys.stdout.write(line + "\n")
    if not follow:
        return
    try:
        for line in follow_log(path, from_line=count, stop=lambda: False, running=lambda: True):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return


@cli_errors
def stop(
    deployment: str | None = typer.Argument(None, help="Deployment (default: the only one)."),
    name: NameAsArgumentOpt = None,
    timeout: float = typer.Option(STOP_TIMEOUT_S, "--timeout", help="Seconds before SIGKILL."),
) -> None:
    """Stop gracefully (SIGTERM, then SIGKILL after --timeout) and clean the state."""
    from sm120.deploy.stop import stop_deployment

    typer.echo(stop_deployment(_one_name(deployment, name), timeout).describe())


logs_parse.register(logs_app)
