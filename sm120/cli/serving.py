"""The launch as the user sees it: the plan preview, progress, questions, the failure
report and the READY banner. What happens (and every exit code) is sm120.deploy.session's."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

from sm120.cli.errors import report
from sm120.cli.present import home_relative, show_nodes, show_plan
from sm120.cli.progress import PhaseProgress
from sm120.cli.weights import weights_for_launch
from sm120.core.errors import SM120Error
from sm120.core.net import http_url
from sm120.deploy.launcher import Ready
from sm120.deploy.session import Prepared, preview_document
from sm120.deploy.wait import PHASE_WORDS
from sm120.logs.phases import Phase
from sm120.plan.resolve import LaunchPlan


class TerminalView:
    """sm120.deploy.session.LaunchView on a terminal: data on stdout, the rest on stderr."""

    def __init__(self, *, as_json: bool = False) -> None:
        self.as_json = as_json

    def preview(self, prepared: Prepared) -> None:
        if self.as_json:
            typer.echo(json.dumps(preview_document(prepared), indent=2))
            return
        show_plan(prepared.checked)
        if prepared.launches is not None:
            show_nodes(prepared.launches)

    def line(self, text: str) -> None:
        sys.stderr.write(text + ("" if text.endswith("\n") else "\n"))

    def starting(self, what: str, timeout_s: float) -> PhaseProgress:
        return PhaseProgress(what, timeout_s)

    def error(self, exc: SM120Error) -> None:
        report(exc)

    def ready(self, ready: Ready) -> None:
        if self.as_json:
            # The banner for people on stderr; the result, with its wall-time split, for scripts.
            banner(ready, Console(stderr=True))
            typer.echo(json.dumps(ready_document(ready), indent=2))
        else:
            banner(ready)
        # Whoever reads READY through a pipe (a service's log) must see it now.
        sys.stdout.flush()

    def asker(self) -> Callable[[str], bool] | None:
        return _ask if sys.stdin.isatty() else None

    def fetch_weights(self, plan: LaunchPlan, yes: bool) -> Path | None:
        return weights_for_launch(plan, yes)


def _ask(question: str) -> bool:
    try:
        return typer.confirm(question, default=True, err=True)
    except typer.Abort:
        # End of input at the prompt: a no, answered by the launch's own one-line refusal.
        sys.stderr.write("\n")
        return False


def next_commands(name: str) -> list[str]:
    """What the READY banner suggests: chat first, then status, logs and stop."""
    return [
        f'sm120 chat --name {name} "hello"',
        f"sm120 status {name}",
        f"sm120 logs --name {name} -f",
        f"sm120 stop {name}",
    ]


def ready_document(ready: Ready) -> dict[str, object]:
    """`sm120 launch --json`: what is serving, where, and where the launch's time went."""
    return {
        "ready": True,
        "name": ready.state.name,
        "recipe": ready.plan.recipe,
        "endpoint": http_url(ready.state.host, ready.state.port, "/v1"),
        "model": ready.plan.model.served_name,
        "answer": ready.answer,
        "monitor_pid": ready.monitor_pid,
        "timings": ready.timings(),
    }


def banner(ready: Ready, console: Console | None = None) -> None:
    plan = ready.plan
    console = console or Console()
    phases = ", ".join(
        f"{PHASE_WORDS.get(Phase(name), name)} {seconds:.0f}s" for name, seconds in ready.phases
    )
    name = ready.state.name
    console.print()
    console.print(f"[bold green]READY[/bold green] {plan.recipe} answered: {ready.answer!r}")
    console.print(
        f"  endpoint  {http_url(ready.state.host, plan.port, '/v1')}   "
        f"model: {plan.model.served_name}"
    )
    chat, *manage = next_commands(name)
    # Whole lines, never wrapped: they are meant to be copied. The key's path gets a line of
    # its own, written from ~, so an 80-column terminal does not break it.
    console.print(f"  chat      {chat}", soft_wrap=True)
    console.print(f"  API key   {home_relative(ready.state.api_key_file)}", soft_wrap=True)
    console.print(f"  manage    {' | '.join(manage)}", soft_wrap=True)
    if ready.monitor_pid:
        console.print(f"  monitor   sm120 monitor (pid {ready.monitor_pid}; peaks, watchdog)")
    kv = ready.wait.tracker.kv_cache_tokens
    if kv:
        console.print(f"  KV cache  {kv:,} tokens")
    console.print(
        f"  took      {ready.total_s:.0f}s in all; waiting {ready.wait.seconds:.0f}s: "
        f"{phases or 'n/a'}",
        soft_wrap=True,
    )
