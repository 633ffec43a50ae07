"""`sm120 tune NAME`: parse the options into one `TuneRequest`, run the search
(sm120.tune.runner), print the result."""

from __future__ import annotations

import json
import os
import shlex
import sys

import typer

from sm120.cli.errors import cli_errors, report
from sm120.cli.options import ModelDirOpt, SetsOpt, VariantsOpt, VllmPythonOpt
from sm120.core.defaults import TUNE_BUDGET_MIN, TUNE_ROUNDS


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)


class _StderrView:
    def line(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def step(self, done: int, total: int, eta_s: float | None, text: str) -> None:
        eta = f", ETA {eta_s / 60:.1f} min" if eta_s is not None else ""
        print(f"[{done + 1}/{total}{eta}] {text}", file=sys.stderr, flush=True)


@cli_errors
def tune(
    recipe: str = typer.Argument(..., help="Recipe to tune, e.g. glm52 (its tune: block)."),
    objective: str | None = typer.Option(
        None, "--objective", help="decode | aggregate | ttft | turn (default: the recipe's)."
    ),
    workload: str | None = typer.Option(
        None, "--workload", help="chat | agent | long | replay:FILE (default: the recipe's)."
    ),
    budget: float = typer.Option(
        TUNE_BUDGET_MIN, "--budget", help="Minutes of launching and measuring, pairs included."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="N of --objective aggregate (default: the recipe's)."
    ),
    rounds: int = typer.Option(TUNE_ROUNDS, "--rounds", help="Measurements per candidate."),
    pairs: int | None = typer.Option(
        None, "--pairs", help="Default/leader pairs at the end (default: the recipe's)."
    ),
    variant: VariantsOpt = [],  # noqa: B006 - Typer copies it
    sets: SetsOpt = [],  # noqa: B006
    model_dir: ModelDirOpt = None,
    vllm_python: VllmPythonOpt = None,
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds to wait for each READY."),
    fresh: bool = typer.Option(False, "--fresh", help="Start over instead of resuming."),
    show: bool = typer.Option(False, "--show", help="Print the result kept here; measure nothing."),
    as_json: bool = typer.Option(False, "--json", help="The result as JSON on stdout."),
) -> None:
    """Search a recipe's tune: space on this host, measured; keep the winner."""
    from sm120.plan.request import plan_request
    from sm120.tune.present import result_lines
    from sm120.tune.runner import TuneInterrupted, TuneRequest, kept_result, run_tune

    if show:
        kept = kept_result(plan_request(recipe, environ=os.environ, variants=variant))
        print(json.dumps(kept, indent=2) if as_json else "\n".join(result_lines(kept)))
        return

    request = TuneRequest(
        plan=plan_request(
            recipe, environ=os.environ, variants=variant, sets=sets, model_dir=model_dir
        ),
        objective=objective,
        workload=workload,
        budget_s=budget * 60,
        concurrency=concurrency,
        rounds=rounds,
        pairs=pairs,
        vllm_python=vllm_python,
        timeout_s=timeout,
        fresh=fresh,
        command=_command(recipe, objective, workload, budget, concurrency, variant, sets),
    )
    try:
        document = run_tune(request, _StderrView())
    except TuneInterrupted as exc:
        report(exc)
        raise typer.Exit(130) from None
    if as_json:
        print(json.dumps(document, indent=2))
        return
    print("\n".join(result_lines(document)))


def _command(
    recipe: str,
    objective: str | None,
    workload: str | None,
    budget: float,
    concurrency: int | None,
    variants: list[str],
    sets: list[str],
) -> str:
    """The command as it would be typed again (the result keeps it as its provenance)."""
    words = ["sm120", "tune", recipe, *(w for v in variants for w in ("-V", v))]
    words += [w for s in sets for w in ("--set", s)]
    for flag, value in (
        ("--objective", objective),
        ("--workload", workload),
        ("--concurrency", concurrency),
    ):
        if value is not None:
            words += [flag, str(value)]
    return shlex.join([*words, "--budget", f"{budget:g}"])
