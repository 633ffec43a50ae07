"""`sm120 eval gsm8k`: lm-evaluation-harness against the running deployment."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sm120.cli.errors import cli_errors
from sm120.cli.options import DeploymentOpt
from sm120.core.errors import SM120Error

if TYPE_CHECKING:
    from sm120.measure.lmeval import EvalSettings

app = typer.Typer(help="Accuracy evaluations through lm-evaluation-harness (extra: eval).")

FLEXIBLE = "exact_match,flexible-extract"


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="eval")


@app.command("gsm8k")
@cli_errors
def gsm8k(
    name: DeploymentOpt = None,
    url: str | None = typer.Option(
        None, "--url", help="Any OpenAI-compatible server instead (key: $OPENAI_API_KEY)."
    ),
    model: str | None = typer.Option(None, "--model", help="With --url: the model to use."),
    limit: int | None = typer.Option(200, "--limit", help="Problems to ask (0: all 1,319)."),
    fewshot: int = typer.Option(5, "--fewshot", help="Worked examples before each problem."),
    concurrency: int = typer.Option(4, "--concurrency", help="Requests in flight."),
    api: str = typer.Option("completions", "--api", help="completions | chat."),
    min_score: float | None = typer.Option(
        None, "--min-score", help="Exit 1 below this flexible-extract exact match (0-1)."
    ),
    output: Path | None = typer.Option(None, "--output", help="Where lm_eval writes results."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command; run nothing."),
    as_json: bool = typer.Option(False, "--json", help="Scores as JSON on stdout."),
) -> None:
    """GSM8K exact match, as the seeds validate builds (5-shot, 200 problems by default)."""
    from sm120.core.paths import sm120_home
    from sm120.measure.lmeval import (
        latest_results,
        lm_eval_command,
        require_lm_eval,
        run_lm_eval,
        scores,
    )
    from sm120.measure.target import find_target

    settings = _settings(limit, fewshot, concurrency, api, min_score)
    if not dry_run:
        require_lm_eval()  # before any network: the one-line error is the whole answer
    target = find_target(name, url, model)
    out_dir = output or sm120_home() / "eval" / time.strftime("%Y%m%d-%H%M%S")
    argv = lm_eval_command(target, settings, out_dir)
    if dry_run:
        typer.echo(shlex.join(argv))
        return
    code = run_lm_eval(argv, target, lambda line: sys.stderr.write(line + "\n"))
    if code != 0:
        raise SM120Error(f"lm_eval exited with code {code}", "see its output above")
    found = scores(latest_results(out_dir), settings.task)
    flexible = found.get(FLEXIBLE)
    if as_json:
        typer.echo(json.dumps({"task": settings.task, "scores": found, "output": str(out_dir)}))
    else:
        for key, value in sorted(found.items()):
            typer.echo(f"{settings.task} {key}: {value:.4f}")
        typer.echo(f"results in {out_dir}")
    if min_score is not None and (flexible is None or flexible < min_score):
        sys.stderr.write(f"{FLEXIBLE} {flexible} is below --min-score {min_score}\n")
        raise typer.Exit(1)


def _settings(
    limit: int | None, fewshot: int, concurrency: int, api: str, min_score: float | None
) -> EvalSettings:
    from sm120.measure.lmeval import EvalSettings

    if api not in ("completions", "chat"):
        raise SM120Error(f"unknown --api '{api}'", "use completions or chat")
    return EvalSettings(
        limit=limit or None,
        fewshot=fewshot,
        concurrency=concurrency,
        api=api,  # type: ignore[arg-type]
    )
