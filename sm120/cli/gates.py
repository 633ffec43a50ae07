"""`sm120 test SUITE...`: correctness gates against the running deployment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sm120.cli.errors import cli_errors
from sm120.cli.options import DeploymentOpt, NoThinkRequestOpt
from sm120.core.errors import SM120Error

if TYPE_CHECKING:
    from sm120.measure.gates import GateOptions


def register(app: typer.Typer) -> None:
    app.command("test")(test)


def gate_options(max_tokens: int | None, temperature: float | None, no_think: bool) -> GateOptions:
    from sm120.measure.gates import GateOptions

    return GateOptions(
        max_tokens=max_tokens, temperature=temperature, thinking=False if no_think else None
    )


@cli_errors
def test(
    suites: list[str] = typer.Argument(..., help="core | long | multiturn | tools (several ok)."),
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
) -> None:
    """Correctness gates: each case passes or fails against expected answers; exit 1 on a fail."""
    from sm120.deploy.gate import chosen_cases, run_gate_suites, split_suites
    from sm120.measure.gate_report import known_failure_lines, summary_line
    from sm120.measure.target import find_target

    names = split_suites(suites)
    if case and len(names) > 1:
        raise SM120Error("--case works with one suite", f"e.g. sm120 test {names[0]} --case ID")
    options = gate_options(max_tokens, temperature, no_think)
    chosen = chosen_cases(names, cases_file, tuple(case))
    target = find_target(name, url, model)
    reports = run_gate_suites(target, chosen, options, echo=None if as_json else typer.echo)
    if as_json:
        ok = not any(report["failed"] for report in reports)
        typer.echo(json.dumps({"ok": ok, "suites": reports}, indent=2))
    else:
        for report in reports:
            typer.echo(summary_line(report))
            for line in known_failure_lines(report):
                typer.echo(f"  {line}")
    raise typer.Exit(1 if any(report["failed"] for report in reports) else 0)
