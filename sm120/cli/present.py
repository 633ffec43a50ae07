"""How plans and recipes look on a terminal (rich; honours NO_COLOR)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sm120.core.net import http_url
from sm120.deploy.checked import CheckedPlan, performance_document, protocols_document
from sm120.deploy.tuned import tuned_summary
from sm120.images.updates import SHOWN as UPDATES_SHOWN
from sm120.images.updates import Update
from sm120.plan.resolve import LaunchPlan, PlanRequest, resolve
from sm120.plan.ward import ward_route
from sm120.recipe.loader import load_recipe, recipe_names
from sm120.render.argv import render_argv
from sm120.render.environment import render_env
from sm120.render.launcher import launcher_env
from sm120.render.multinode import NodeLaunch


def home_relative(path: str | None) -> str:
    """A path as a user types it: under the home directory it starts with ~ (shorter lines)."""
    if not path:
        return "-"
    home = Path.home()
    try:
        return str(Path("~") / Path(path).relative_to(home))
    except ValueError:
        return path


_STATUS_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "forced": "magenta"}


def _baseline_text(recipe_name: str) -> str:
    baseline = load_recipe(recipe_name).baseline
    if baseline is None:
        return "-"
    parts = []
    if baseline.decode_tps:
        parts.append(f"{baseline.decode_tps:g} tok/s decode")
    if baseline.max_context:
        parts.append(f"{baseline.max_context:,} ctx")
    if baseline.kv_pool_tokens and not parts:
        parts.append(f"{baseline.kv_pool_tokens:,}-token KV pool")
    return ", ".join(parts) or "-"


def recipe_rows() -> list[dict[str, Any]]:
    rows = []
    for name in recipe_names():
        recipe = load_recipe(name)
        revision = recipe.model.revision
        # Each recipe as written, not through plan.request: a .env or SM120_* setting is
        # meant for one recipe (VARIANT names its variants), and this table lists them all.
        performance = performance_document(resolve(PlanRequest(recipe=name), recipe))
        published = performance["published"]
        rows.append(
            {
                "name": name,
                "model": recipe.model.repo or f"generated ({recipe.model.generated})",
                "revision": revision[:10]
                if revision
                else ("local" if recipe.model.generated else "unpinned"),
                "engine": recipe.engine,
                "gpus": recipe.hardware.gpus,
                "hardware": ", ".join(recipe.hardware.compute_caps),
                "baseline": _baseline_text(name),
                "published_decode_tok_s": published["decode_tok_s"] if published else None,
                "roofline_decode_tok_s": performance["roofline_decode_tok_s"],
                "roofline_spec_decode_tok_s": performance["roofline_spec_decode_tok_s"],
                "variants": list(recipe.variants),
            }
        )
    return rows


def _tok_s(value: float | None) -> str:
    return f"{value:g} tok/s" if value else "-"


def recipes_table(rows: list[dict[str, Any]]) -> None:
    table = Table(title="sm120 recipes")
    columns = ("name", "model", "engine", "GPUs", "validated on", "baseline")
    for column in (*columns, "published / roofline decode", "variants"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["name"],
            f"{row['model']} @ {row['revision']}",
            row["engine"],
            str(row["gpus"]),
            row["hardware"],
            row["baseline"],
            f"{_tok_s(row['published_decode_tok_s'])} / {_tok_s(row['roofline_decode_tok_s'])}",
            ", ".join(row["variants"]) or "-",
        )
    Console().print(table)


def _flag_lines(checked: CheckedPlan) -> list[tuple[str, str]]:
    plan = checked.plan
    argv = render_argv(plan)
    lines: list[tuple[str, str]] = [(shlex.join(argv[:5]), "")]
    index = 5
    while index < len(argv):
        token = argv[index]
        # a flag's values run to the next flag (one, or several for an int_list flag)
        end = index + 1
        while end < len(argv) and not argv[end].startswith("--"):
            end += 1
        text = shlex.join(argv[index:end])
        name = token.removeprefix("--").removeprefix("no-")
        # A tuned value is not the one the recipe's why-note explains.
        tuned = plan.provenance.get(f"args.{name}") == "tuned"
        lines.append(
            (f"  {text}", "tuned on this host (sm120 tune)" if tuned else plan.why.get(name, ""))
        )
        index = end
    return lines


def protocol_lines(engine: str, version: str) -> list[str]:
    """Which client protocols the engine build serves natively, and which it lacks."""
    document = protocols_document(engine, version)
    if not document["serves"] and not document["lacks"]:
        return ["protocols not known for this engine build (the gateway passes every one on)"]
    lines = [f"protocols {' '.join(document['serves'])}"]
    if document["lacks"]:
        lines.append(
            f"          not served: {' '.join(document['lacks'])} (the gateway answers 501 "
            "naming the engine; use another protocol or another variant)"
        )
    return lines


def _other_checkpoint(plan: LaunchPlan) -> str | None:
    """The default's checkpoint when a variant serves another one (a bundled recipe only)."""
    if plan.recipe not in recipe_names():
        return None
    default = load_recipe(plan.recipe).model.repo
    return default if default and plan.model.repo != default else None


def show_plan(checked: CheckedPlan) -> None:
    plan = checked.plan
    console = Console()
    variants = ", ".join(plan.variants) or "default"
    console.print(f"[bold]{plan.recipe}[/bold] ({variants}): {plan.title}")
    console.print(f"image     {plan.image_ref}  [dim]({plan.image.build})[/dim]")
    pin = f"pinned to {plan.image.pin}" if plan.image.pin else "not pinned: tag only"
    console.print(f"engine    {plan.image.engine_version}  [dim]({pin})[/dim]")
    revision = plan.model.revision or ("local" if plan.model.generated else "unpinned")
    console.print(
        f"model     {plan.model.repo or 'generated'} @ {revision}"
        f"  dir: {plan.model_dir or '(hub cache)'}"
    )
    if other := _other_checkpoint(plan):
        console.print(f"          [bold]another checkpoint[/bold] than the default's ({other})")
    endpoint = http_url(plan.host, plan.port, "/v1")
    # Printed as text, not markup: "[fe80::1%25eth0]" would read as a rich tag and vanish.
    console.print(
        f"endpoint  {endpoint}  model={plan.model.served_name}", markup=False, highlight=False
    )
    for line in protocol_lines(plan.engine, plan.image.engine_version):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    route = ward_route(plan)
    console.print(f"ward      {route.way}: {route.why}", soft_wrap=True, markup=False,
                  highlight=False)  # fmt: skip
    console.print(
        f"hardware  {checked.hardware.describe()}; recipe validated on {plan.hardware.validated_on}"
    )
    console.print(f"plan      {plan.plan_hash}")
    _show_performance(console, checked)
    if plan.launcher is not None:
        _show_launcher(console, plan)
    else:
        console.print("\n[bold]command[/bold]")
        for text, why in _flag_lines(checked):
            console.print(text + (f"  [dim]# {why}[/dim]" if why else ""), soft_wrap=True)
    env = plan.env_dict if plan.launcher is not None else render_env(plan)
    if env:
        console.print("\n[bold]environment[/bold]")
        for key, value in env.items():
            why = plan.why.get(key, "")
            console.print(
                f"  {key}={value}" + (f"  [dim]# {why}[/dim]" if why else ""), soft_wrap=True
            )
    _show_derived(console, checked)
    _show_rules(console, checked)


def _show_launcher(console: Console, plan: LaunchPlan) -> None:
    """A route the image's own entrypoint runs: its command, the knobs sm120 renders for it,
    where their expansion is published (or why not), and the flags the source says it runs."""
    assert plan.launcher is not None
    launcher = plan.launcher
    console.print("\n[bold]command[/bold] (the image's own launcher, run as is)")
    console.print(f"{shlex.join(launcher.command)}", soft_wrap=True, markup=False)
    console.print("\n[bold]launcher knobs[/bold]")
    carried = {knob: flag for knob, flag in launcher.from_args.items()}
    for key, value in launcher_env(plan).items():
        note = f"from {carried[key]}" if key in carried else plan.why.get(key, "")
        console.print(
            escape(f"  {key}={value}") + (f"  [dim]# {escape(note)}[/dim]" if note else ""),
            soft_wrap=True,
        )
    console.print(f"expansion {launcher.expansion}", soft_wrap=True, markup=False)
    console.print(f"source    {launcher.source}", soft_wrap=True, markup=False)
    console.print(
        "\n[bold]flags the source says it runs[/bold] (read by the planner and the rules; "
        "only those a knob carries reach the launcher)"
    )
    flags = set(carried.values())
    for name, value in plan.args:
        text = json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else value
        mark = "  [dim]# a knob carries it[/dim]" if name in flags else ""
        console.print(escape(f"  --{name} {text}") + mark, soft_wrap=True)


def performance_lines(plan: LaunchPlan) -> list[str]:
    """Published figures, the decode roofline and their ratio, one fact a line."""
    document = performance_document(plan)
    published, roofline = document["published"], document["roofline_decode_tok_s"]
    lines = []
    if published is None:
        lines.append("published  none with an openable source for this configuration")
    else:
        lines.append(
            f"published  {published['decode_tok_s']:g} tok/s decode at 1 request"
            f" ({published['hardware']}, {published['date']}, {published['engine_ref']})"
        )
        if published["prefill_tok_s"]:
            lines.append(f"           {published['prefill_tok_s']:g} tok/s prefill")
        if published["throughput_tok_s"]:
            lines.append(
                f"           {published['throughput_tok_s']:g} tok/s at "
                f"{published['throughput_concurrency']} concurrent requests"
            )
        lines.append(f"           source: {published['source']}")
    if roofline is None:
        lines.append(f"roofline   unknown: {document['roofline']['unknown']}")
    else:
        detail = document["roofline"]
        lines.append(
            f"roofline   {roofline:g} tok/s decode at {detail['context_tokens']:,} tokens"
            f" (TP {detail['tensor_parallel']} x {detail['bandwidth_gbs_per_gpu']:g} GB/s,"
            f" {detail['weight_gb_per_token']:g} GB of weights a token)"
        )
    spec = document["roofline_spec"]
    if spec is not None:
        lines.append(
            f"spec       {spec['decode_tok_s']:g} tok/s decode with {spec['method']} "
            f"{spec['draft_tokens']}: {spec['tokens_per_pass']:g} tokens a pass "
            f"({spec['draft_cost']})"
        )
        lines.append(f"           acceptance: {spec['acceptance_from']}")
    if published is not None and roofline:
        lines.append(
            f"ratio      published / roofline = {published['decode_tok_s'] / roofline:.2f}"
            " (speculative decoding can pass 1)"
        )
    if document["published_suspect"]:
        bound = "speculative roofline" if spec is not None else "roofline"
        lines.append(
            f"suspect    the published figure is above the {bound}: check its source's "
            "conditions before taking it as a target"
        )
    return lines + tuned_lines(plan)


def tuned_lines(plan: LaunchPlan) -> list[str]:
    """`sm120 tune`'s result for this host, when one is kept (none: no line, no GPU read)."""
    summary = tuned_summary(plan)
    if summary is None:
        return []
    unit = summary["unit"] or ""
    lines = [f"tuned      {summary['line']}"]
    if summary["leader"] is not None and summary["default"] is not None:
        lines.append(
            f"           {summary['objective']}: {summary['leader']:,.1f} {unit} tuned, "
            f"{summary['default']:,.1f} {unit} default (sm120 tune {plan.recipe} --show)"
        )
    return lines


def _show_performance(console: Console, checked: CheckedPlan) -> None:
    console.print("\n[bold]performance[/bold]")
    for line in performance_lines(checked.plan):
        console.print(f"  {line}", soft_wrap=True, markup=False, highlight=False)


_UPDATE_TEXT = {
    "current": "no newer build",
    "incomplete": "none newer found",
    "unordered": "tags not comparable",
    "moved": "rebuilt under the same tag",
    "unreachable": "unreachable",
    "not-watched": "not watched",
}


def update_lines(updates: list[Update]) -> list[str]:
    """One line per engine build: recipe, variant, what is pinned, what is newer."""
    lines = []
    for update in updates:
        watched = update.watched
        where = f"{watched.recipe} ({', '.join(watched.variants) or 'default'})"
        if update.status == "newer":
            shown = ", ".join(update.newer[:UPDATES_SHOWN])
            more = len(update.newer) - UPDATES_SHOWN
            state = f"newer: {shown}" + (f" (+{more} more)" if more > 0 else "")
            state += f"; {update.detail}" if update.detail else ""
        else:
            state = _UPDATE_TEXT[update.status]
            state += f": {update.detail}" if update.detail else ""
        lines.append(f"{where:<24} {watched.source:<5} {watched.label}  {state}")
    return lines


def _show_derived(console: Console, checked: CheckedPlan) -> None:
    plan = checked.plan
    pattern = plan.derived.get("index_topk_pattern")
    if pattern:
        console.print("\n[bold]derived[/bold]")
        console.print(f"  index_topk_pattern from {pattern['source']}: {pattern['pattern']}")
        if "skip_layers" in pattern:
            console.print(
                f"  {pattern['full_layers']} full / {pattern['skip_layers']} shared layers: "
                f"expect {pattern['skip_layers']} 'skip sparse MLA indexer' boot lines (F09)"
            )
    for note in plan.pending:
        console.print(f"\n[bold]at launch[/bold]\n  {note}")


def _show_rules(console: Console, checked: CheckedPlan) -> None:
    console.print("\n[bold]rules[/bold]")
    for result in checked.results:
        if result.status == "pass":
            continue
        style = _STATUS_STYLE[result.status]
        for message in result.messages or ("skipped by --force",):
            console.print(
                # a message quotes engine code ("cpu[dp_rank]"): not rich markup
                f"  [{style}]{result.status.upper():6}[/{style}] {result.id} {escape(message)}",
                soft_wrap=True,
            )
    passed = sum(1 for r in checked.results if r.status == "pass")
    console.print(f"  {passed}/{len(checked.results)} rules pass")


def show_nodes(launches: list[NodeLaunch]) -> None:
    """Per node of a multi-node plan: where it runs and what, in start order within the node."""
    console = Console()
    for launch in launches:
        console.print(f"\n[bold]node{launch.rank}[/bold] {launch.role} {launch.host}")
        for process in launch.processes:
            console.print(f"  {process.name}: {shlex.join(process.argv)}", soft_wrap=True)
        node_only = {
            k: v
            for k, v in launch.env.items()
            if k.endswith("_IFNAME") or k.startswith(("VLLM_HOST_IP", "RAY_"))
        }
        for key, value in node_only.items():
            console.print(f"  {key}={value}")
