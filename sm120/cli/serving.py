"""The launch flow as the user sees it: progress, failure report, READY banner."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

from rich.console import Console

from sm120.checks import CheckedPlan
from sm120.cli.errors import report
from sm120.cli.progress import PhaseProgress
from sm120.errors import SM120Error
from sm120.lifecycle.launcher import LaunchOptions, Ready, describe_failure, launch
from sm120.lifecycle.wait import PHASE_WORDS, StartupFailed
from sm120.phases import Phase
from sm120.runtime.base import Runtime
from sm120.runtime.native import NativeRuntime
from sm120.state import clear_state

if TYPE_CHECKING:
    from sm120.cluster.launch import ClusterRequest


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve(
    checked: CheckedPlan,
    options: LaunchOptions,
    *,
    foreground: bool,
    cluster: ClusterRequest | None = None,
) -> int:
    runtime: Runtime = NativeRuntime()
    if cluster is not None:
        from sm120.cluster.runtime import ClusterRuntime

        runtime = ClusterRuntime()
    plan = checked.plan
    # SIGTERM to the launcher (e.g. a CI timeout) cleans up like Ctrl-C does.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    timeout = options.timeout_s or plan.timeouts.ready_s
    try:
        with PhaseProgress(plan.recipe, timeout) as progress:
            if cluster is not None:
                from sm120.cluster.launch import launch_cluster

                ready = launch_cluster(checked, cluster, options, progress.message, progress.update)
            else:
                ready = launch(checked, runtime, options, progress.message, progress.update)
    except StartupFailed as exc:
        for line in describe_failure(exc):
            sys.stderr.write(line + "\n")
        report(exc)
        return 2
    except KeyboardInterrupt:
        what = "every node was stopped" if cluster else "the engine was stopped"
        sys.stderr.write(f"interrupted: {what} and nothing is left running\n")
        return 130
    except SM120Error as exc:
        report(exc)
        return 2
    banner(ready)
    if foreground:
        return _follow_until_interrupted(ready, runtime)
    return 0


def banner(ready: Ready) -> None:
    plan = ready.plan
    console = Console()
    phases = ", ".join(
        f"{PHASE_WORDS.get(Phase(name), name)} {seconds:.0f}s" for name, seconds in ready.phases
    )
    name = ready.state.name
    console.print()
    console.print(f"[bold green]READY[/bold green] {plan.recipe} answered: {ready.answer!r}")
    console.print(
        f"  endpoint  http://{ready.state.host}:{plan.port}/v1   model: {plan.model.served_name}"
    )
    console.print(f'  chat      sm120 chat "hello"   (API key: {ready.state.api_key_file})')
    console.print(f"  manage    sm120 status | sm120 logs -f | sm120 stop {name}")
    kv = ready.wait.tracker.kv_cache_tokens
    if kv:
        console.print(f"  KV cache  {kv:,} tokens")
    console.print(
        f"  took      {ready.total_s:.0f}s in all; waiting {ready.wait.seconds:.0f}s: "
        f"{phases or 'n/a'}",
        soft_wrap=True,
    )


def _follow_until_interrupted(ready: Ready, runtime: Runtime) -> int:
    state = ready.state
    try:
        for line in runtime.follow(state):
            sys.stderr.write(line + ("\n" if not line.endswith("\n") else ""))
        info = runtime.exit_info(state)
        sys.stderr.write(f"the engine {info.describe() if info else 'stopped'}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("stopping...\n")
        runtime.stop(state)
        clear_state(state.name)
        return 0
