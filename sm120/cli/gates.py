"""`sm120 test SUITE...`: correctness gates against the running deployment."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sm120.cli.errors import cli_errors
from sm120.core.errors import SM120Error

if TYPE_CHECKING:
    from sm120.measure.cases import Case
    from sm120.measure.gates import GateOptions
    from sm120.measure.target import Target


def register(app: typer.Typer) -> None:
    app.command("test")(test)


def gate_options(max_tokens: int | None, temperature: float | None, no_think: bool) -> GateOptions:
    from sm120.measure.gates import GateOptions

    return GateOptions(
        max_tokens=max_tokens, temperature=temperature, thinking=False if no_think else None
    )


def chosen_cases(
    suites: list[str], cases_file: Path | None = None, case_ids: tuple[str, ...] = ()
) -> list[tuple[str, tuple[Case, ...]]]:
    """Load and select before anything talks to a server: a typo costs nothing."""
    from sm120.measure.cases import load_gates, select

    gates = load_gates(cases_file)
    return [(suite, select(gates, suite, case_ids)) for suite in suites]


def run_gate_suites(
    target: Target,
    chosen: list[tuple[str, tuple[Case, ...]]],
    options: GateOptions,
    *,
    echo: Callable[[str], None] | None = typer.echo,
) -> list[dict[str, Any]]:
    """Run the suites in order; `echo` gets the lines of each case as it finishes."""
    from sm120.measure.gate_report import case_lines
    from sm120.measure.gates import run_cases

    def show(result: dict[str, Any]) -> None:
        if echo is not None:
            for line in case_lines(result):
                echo(line)

    return [run_cases(target, suite, cases, options, show) for suite, cases in chosen]


def split_suites(suites: list[str]) -> list[str]:
    names = [s.strip() for item in suites for s in item.split(",") if s.strip()]
    if not names:
        raise SM120Error("no gate suite named", "e.g. sm120 test core")
    return names


@cli_errors
def test(
    suites: list[str] = typer.Argument(..., help="core | long | multiturn | tools (several ok)."),
    case: list[str] = typer.Option([], "--case", help="Only these case ids."),
    name: str | None = typer.Option(None, "--name", help="Deployment (default: the only one)."),
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
    no_think: bool = typer.Option(False, "--no-think", help="Ask the model not to reason."),
    cases_file: Path | None = typer.Option(
        None, "--cases", help="A YAML file of suites (default: the built-in ones)."
    ),
    as_json: bool = typer.Option(False, "--json", help="All results as JSON on stdout."),
) -> None:
    """Correctness gates: each case passes or fails against expected answers; exit 1 on a fail."""
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
