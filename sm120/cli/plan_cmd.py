"""`sm120 plan NAME --gpus N`: will it fit, and how, before anything starts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sm120.cli.errors import cli_errors
from sm120.cli.options import ModelDirOpt, SetsOpt, VariantsOpt

if TYPE_CHECKING:
    from sm120.plan.fit.recommend import Report


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


@cli_errors
def plan(
    recipe: str = typer.Argument(..., help="Recipe to plan, e.g. glm52 (see 'sm120 recipes')."),
    gpus: int = typer.Option(..., "--gpus", help="GPUs available for the model."),
    gpu_mem_gib: float | None = typer.Option(
        None, "--gpu-mem-gib", help="Memory per GPU in GiB (default: the recipe's)."
    ),
    variant: VariantsOpt = [],  # noqa: B006 - Typer copies it
    sets: SetsOpt = [],  # noqa: B006
    kv_memory_gib: float | None = typer.Option(
        None,
        "--kv-memory-gib",
        help="KV memory per GPU as given (e.g. the engine's 'Available KV cache memory').",
    ),
    model_dir: ModelDirOpt = None,
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", help="Context to plan for (default: the recipe's)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Predict weights and KV per GPU, the longest context and concurrency (exit 1: F08)."""
    from sm120.core.errors import PlanError
    from sm120.plan.fit.dims import load_dims
    from sm120.plan.fit.memory import build_spec, planned_layout
    from sm120.plan.fit.recommend import build_report, mxfp4_weights_gib, report_document
    from sm120.plan.request import plan_request
    from sm120.plan.resolve import resolve
    from sm120.plan.rules import value_problems
    from sm120.recipe.loader import load_recipe

    if model_dir is not None and not Path(model_dir).expanduser().is_dir():
        raise PlanError(
            f"--model-dir {model_dir} is not a folder",
            "pass the checkpoint folder that holds config.json",
        )
    loaded = load_recipe(recipe)
    request = plan_request(
        recipe, environ=os.environ, variants=variant, sets=sets, model_dir=model_dir
    )
    launch_plan = resolve(request, loaded)
    problems = value_problems(launch_plan)
    if problems:
        raise PlanError(problems[0], "'sm120 launch' refuses the same value; fix it and plan again")
    model = launch_plan.model
    dims = load_dims(
        model.dims, model.weights_gib, launch_plan.model_dir, model.repo, model.architecture
    )
    spec = build_spec(launch_plan, dims, gpus, gpu_mem_gib, kv_memory_gib, max_model_len)
    tp, dcp = planned_layout(launch_plan)
    if tp > gpus:
        raise PlanError(
            f"the plan uses tensor-parallel-size {tp} but --gpus is {gpus}",
            f"pass --gpus {tp}, or pick a variant for fewer GPUs",
        )
    report = build_report(spec, tp, dcp, mxfp4_weights_gib(loaded))
    tier = None
    if launch_plan.kv_tier is not None:
        from sm120.plan.fit.tier import tier_capacity

        layout = report.planned.layout
        ranks = tp * int(launch_plan.arg("pipeline-parallel-size", 1) or 1)
        tier = tier_capacity(launch_plan.kv_tier, layout, spec.context, ranks)
    if as_json:
        document = report_document(report, recipe, launch_plan.identity_variants)
        if tier is not None:
            document["kv_tier"] = tier.as_dict()
        typer.echo(json.dumps(document, indent=2))
    else:
        _show(report, recipe)
        if tier is not None:
            typer.echo(
                f"KV tier ({tier.backend}): {tier.cpu_tokens:,} tokens in {tier.pinned_gib:g} GiB "
                f"of pinned host RAM ({tier.pinned_gib / tier.ranks:g} GiB per rank x "
                f"{tier.ranks})"
                + (
                    f", {tier.disk_tokens:,} more on {tier.disk_gib:g} GiB of disk"
                    if tier.disk_tokens is not None
                    else ""
                )
            )
    if report.failed:
        raise typer.Exit(1)


def _show(report: Report, recipe: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from sm120.plan.fit.dims import GIB

    spec, planned = report.spec, report.planned
    context = spec.context
    title = (
        f"sm120 plan {recipe}: {spec.gpus} GPU(s), TP {planned.tp}, DCP {planned.dcp}, "
        f"max-model-len {context:,}"
    )
    table = Table(title=title, show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    weights = planned.weights_gib_per_gpu
    about = "~" if spec.weights_estimate is not None else ""  # counted from model.dims
    table.add_row(
        "weights / GPU",
        "unknown" if weights is None else f"{about}{weights:.2f} GiB ({spec.dims.weights_source})",
    )
    table.add_row(
        "KV memory / GPU",
        f"{planned.kv_memory_gib_per_gpu:.2f} GiB ({planned.kv_memory_source})",
    )
    table.add_row("KV cache", f"{spec.kv_dtype.name}, {spec.block_size}-token blocks")
    table.add_row("KV layout", planned.layout.summary)
    table.add_row("allocator modelled", spec.engine_version)
    table.add_row("KV bytes / token / rank", f"{planned.layout.bytes_per_token(context):,.0f}")
    table.add_row(
        f"KV for one {context:,}-token request",
        f"{planned.layout.bytes_per_request(context) / GIB:.2f} GiB per GPU",
    )
    table.add_row("KV pool", f"{planned.pool.tokens:,} tokens")
    table.add_row("longest context", f"{planned.pool.max_context:,} tokens")
    table.add_row(f"concurrency at {context:,}", f"{planned.pool.concurrency:.2f}x")
    for flag in report.flags:
        style = "bold red" if flag.severity == "error" else "yellow"
        table.add_row(f"[{style}]{flag.id}[/]", f"{flag.message} (fix: {flag.fix})")
    rec = report.recommendation
    table.add_row(
        "[green]recommendation[/]",
        f"TP {rec.tp}, DCP {rec.dcp}, max-model-len {rec.max_model_len:,}: {rec.reason}",
    )
    console = Console()
    console.print(table)
    options = Table(title="layouts", show_edge=False)
    for column in ("TP", "DCP", "KV pool", "longest context", f"concurrency at {context:,}"):
        options.add_column(column, justify="right")
    for option in report.alternatives:
        mark = "" if option.fits(spec) else " (too short)"
        options.add_row(
            str(option.tp),
            str(option.dcp),
            f"{option.pool.tokens:,}",
            f"{option.pool.max_context:,}{mark}",
            f"{option.pool.concurrency:.2f}x",
        )
    console.print(options)
