"""`sm120 test SUITE...`: correctness gates against the running deployment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sm120.cli.errors import cli_errors
from sm120.cli.options import DeploymentOpt, NoThinkRequestOpt
from sm120.core.errors import SM120Error

if TYPE_CHECKING:
    from sm120.measure.agent import AgentOptions
    from sm120.measure.gates import GateOptions
    from sm120.measure.target import Target

AGENT = "agent"


def register(app: typer.Typer) -> None:
    app.command("test")(test)


def gate_options(max_tokens: int | None, temperature: float | None, no_think: bool) -> GateOptions:
    from sm120.measure.gates import GateOptions

    return GateOptions(
        max_tokens=max_tokens, temperature=temperature, thinking=False if no_think else None
    )


@cli_errors
def test(
    suites: list[str] = typer.Argument(
        ..., help="core | long | multiturn | tools | agent (several ok)."
    ),
    case: list[str] = typer.Option([], "--case", help="Only these case ids."),
    name: DeploymentOpt = None,
    url: str | None = typer.Option(
        None, "--url", help="Any OpenAI-compatible server instead (key: $OPENAI_API_KEY)."
    ),
    model: str | None = typer.Option(None, "--model", help="With --url: the model to use."),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", help="Cap each answer (default: no cap)."
    ),
    temperature: float | None = typer.Option(
        None, "--temperature", help="Sampling temperature (default: the server's)."
    ),
    no_think: NoThinkRequestOpt = False,
    cases_file: Path | None = typer.Option(
        None, "--cases", help="A YAML file of suites (default: the built-in ones)."
    ),
    as_json: bool = typer.Option(False, "--json", help="All results as JSON on stdout."),
    api: list[str] = typer.Option(
        [], "--api", help="agent: messages | chat (default: both, one session each)."
    ),
    turns: int | None = typer.Option(
        None, "--turns", help="agent: replay only the first N of the session's 10 turns."
    ),
    protocol_only: bool | None = typer.Option(
        None,
        "--protocol-only/--full",
        help="agent: force each tool and check only the protocol, or also check that the "
        "model picks the right tool (default: protocol only on the random tiny model).",
    ),
) -> None:
    """Correctness gates: each case passes or fails against expected answers; exit 1 on a fail."""
    from sm120.deploy.gate import chosen_cases, run_gate_suites, split_suites
    from sm120.measure.agent import agent_options
    from sm120.measure.gate_report import known_failure_lines, prefix_cache_line, summary_line
    from sm120.measure.target import find_target

    names = split_suites(suites)
    if case and len(names) > 1:
        raise SM120Error("--case works with one suite", f"e.g. sm120 test {names[0]} --case ID")
    if case and AGENT in names:
        raise SM120Error("--case does not apply to the agent session", "use --turns N")
    gate_names = [n for n in names if n != AGENT]
    options = gate_options(max_tokens, temperature, no_think)
    chosen = chosen_cases(gate_names, cases_file, tuple(case)) if gate_names else []
    agent = agent_options(api, turns, max_tokens, protocol_only, temperature)
    target = find_target(name, url, model)
    reports = run_gate_suites(target, chosen, options, echo=None if as_json else typer.echo)
    if AGENT in names:
        reports.append(_run_agent(target, agent, as_json))
    if as_json:
        ok = not any(report["failed"] for report in reports)
        typer.echo(json.dumps({"ok": ok, "suites": reports}, indent=2))
    else:
        for report in reports:
            typer.echo(summary_line(report))
            for line in known_failure_lines(report):
                typer.echo(f"  {line}")
            cache = prefix_cache_line(report)
            if cache:
                typer.echo(f"  {cache}")
    raise typer.Exit(1 if any(report["failed"] for report in reports) else 0)


def _run_agent(target: Target, options: AgentOptions, as_json: bool) -> dict[str, Any]:
    from sm120.measure.agent import run_agent
    from sm120.measure.gate_report import case_lines

    def show(result: dict[str, Any]) -> None:
        if not as_json:
            for line in case_lines(result):
                typer.echo(line)

    return run_agent(target, options, show)
