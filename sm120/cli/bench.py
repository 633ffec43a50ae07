"""`sm120 bench`: throughput of the running deployment, kept in a history and compared."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

import typer

from sm120.cli.bounds import bound_for, check_number
from sm120.cli.errors import cli_errors
from sm120.cli.options import DeploymentOpt
from sm120.core.defaults import BENCH_SETTLE_S
from sm120.core.errors import SM120Error

if TYPE_CHECKING:
    from sm120.measure.bench import BenchOptions
    from sm120.measure.history import Comparison


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


def parse_ints(text: str | None, option: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or any(v <= 0 for v in values):
        raise SM120Error(
            f"{option} expects comma-separated positive integers, got '{text[:80]}'",
            f"e.g. {option} 1024,8192",
        )
    bound = bound_for("bench", option)
    if bound is not None:
        for value in values:
            check_number(option, value, bound)
    return values


@cli_errors
def bench(
    name: DeploymentOpt = None,
    url: str | None = typer.Option(
        None, "--url", help="Any OpenAI-compatible server instead (key: $OPENAI_API_KEY)."
    ),
    model: str | None = typer.Option(None, "--model", help="With --url: the model to use."),
    quick: bool = typer.Option(False, "--quick", help="Decode and one prompt length only."),
    sweep: bool = typer.Option(False, "--sweep", help="Concurrency up to max-num-seqs."),
    tool: str = typer.Option("auto", "--tool", help="auto | vllm | ours (see the docs)."),
    lengths: str | None = typer.Option(None, "--lengths", help="Prompt lengths, e.g. 1024,8192."),
    concurrency: str | None = typer.Option(
        None, "--concurrency", help="Concurrency levels, e.g. 1,2,4."
    ),
    decode_tokens: int | None = typer.Option(
        None, "--decode-tokens", help="Tokens per decode request."
    ),
    requests: int | None = typer.Option(None, "--requests", help="Requests per point."),
    settle: float = typer.Option(
        BENCH_SETTLE_S, "--settle", help="Seconds to pause before each measured phase, either tool."
    ),
    threshold: float = typer.Option(
        0.10, "--threshold", help="Regression: this fraction below a reference."
    ),
    fail_on_regression: bool = typer.Option(
        False, "--fail-on-regression", help="Exit 1 when a figure regressed."
    ),
    no_save: bool = typer.Option(False, "--no-save", help="Do not add to the history."),
    vllm_python: str | None = typer.Option(
        None, "--vllm-python", help="Python with vLLM for 'vllm bench serve'."
    ),
    as_json: bool = typer.Option(False, "--json", help="The report as JSON on stdout."),
) -> None:
    """Decode, TTFT/prefill per prompt length, a concurrency sweep, speculative acceptance."""
    from dataclasses import replace

    from rich.console import Console

    from sm120.core.paths import sm120_home
    from sm120.measure import history
    from sm120.measure.bench import run_bench
    from sm120.measure.reference import decode_against
    from sm120.measure.target import find_target

    options = _options(quick, sweep, tool, lengths, concurrency, decode_tokens, requests)
    options = replace(options, vllm_python=vllm_python, settle_s=settle)
    target = find_target(name, url, model)
    err = Console(stderr=True)
    result_dir = sm120_home() / "bench" / "runs" / time.strftime("%Y%m%d-%H%M%S")
    with err.status("benchmarking", spinner="dots") as status:

        def progress(line: str) -> None:
            status.update(f"benchmarking: {line[:100]}")

        report = run_bench(target, options, progress, result_dir)
    earlier = history.records(target.history_key)
    previous = earlier[-1] if earlier else None
    comparisons = history.compare(report, target.baseline, previous, threshold)
    report["comparisons"] = [c.as_dict() for c in comparisons]
    report["against"] = decode_against(report, target.published, target.roofline_decode_tok_s)
    report["speculative"] = target.speculative
    report["result_dir"] = str(result_dir) if result_dir.is_dir() else None
    if not no_save:
        history.append(report)
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    else:
        from sm120.measure.present import show_bench

        show_bench(report)
    raise typer.Exit(_exit_code(report, comparisons, fail_on_regression))


def _options(
    quick: bool,
    sweep: bool,
    tool: str,
    lengths: str | None,
    concurrency: str | None,
    decode_tokens: int | None,
    requests: int | None,
) -> BenchOptions:
    from sm120.measure.bench import BenchOptions

    if quick and sweep:
        raise SM120Error("--quick and --sweep exclude each other", "pick one")
    if tool not in ("auto", "vllm", "ours"):
        raise SM120Error(f"unknown --tool '{tool}'", "use auto, vllm or ours")
    return BenchOptions(
        mode="quick" if quick else "sweep" if sweep else "default",
        tool=tool,  # type: ignore[arg-type]
        lengths=parse_ints(lengths, "--lengths"),
        concurrency=parse_ints(concurrency, "--concurrency"),
        decode_tokens=decode_tokens,
        requests=requests,
    )


def _exit_code(report: dict[str, object], comparisons: list[Comparison], fail: bool) -> int:
    failed = _failed_requests(report)
    if failed:
        sys.stderr.write(f"{failed} benchmark requests failed (see the report)\n")
        return 1
    regressed = [c for c in comparisons if c.regression]
    if regressed:
        names = ", ".join(f"{c.figure} vs {c.against}" for c in regressed)
        sys.stderr.write(f"regression beyond the threshold: {names}\n")
        return 1 if fail else 0
    return 0


def _failed_requests(report: dict[str, object]) -> int:
    total = 0
    decode = report.get("decode")
    if isinstance(decode, dict):
        total += int(decode.get("failed") or 0)
    for key in ("prefill", "concurrency"):
        points = report.get(key)
        if isinstance(points, list):
            total += sum(int(p.get("failed") or 0) for p in points if isinstance(p, dict))
    return total
