"""The launch flow as the user sees it: progress, failure report, READY banner."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console

from sm120.cli.errors import report
from sm120.cli.present import home_relative
from sm120.cli.progress import PhaseProgress
from sm120.core.errors import SM120Error
from sm120.core.net import http_url
from sm120.deploy.checked import CheckedPlan
from sm120.deploy.launcher import LaunchOptions, Ready, describe_failure, launch
from sm120.deploy.wait import PHASE_WORDS, StartupFailed
from sm120.engine.runtime.base import Runtime
from sm120.engine.runtime.native import NativeRuntime
from sm120.engine.state import clear_state, deployment_lock
from sm120.logs.phases import Phase

if TYPE_CHECKING:
    from sm120.deploy.cluster import ClusterRequest


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@dataclass(frozen=True)
class GateRequest:
    """`launch --gate`: suites to pass before READY is announced."""

    suites: tuple[str, ...]
    keep_on_fail: bool = False
    max_tokens: int | None = None


def serve(
    checked: CheckedPlan,
    options: LaunchOptions,
    *,
    runtime: str = "native",
    foreground: bool,
    gate: GateRequest | None = None,
    cluster: ClusterRequest | None = None,
) -> int:
    engine_runtime: Runtime
    if cluster is not None:
        from sm120.engine.cluster.runtime import ClusterRuntime

        # --runtime applies per node (SSH or Docker over ssh://), inside the cluster runtime.
        engine_runtime = ClusterRuntime()
    else:
        engine_runtime = _runtime(runtime)
    plan = checked.plan
    # SIGTERM to the launcher (e.g. a CI timeout) cleans up like Ctrl-C does.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    timeout = options.timeout_s or plan.timeouts.ready_s
    try:
        with PhaseProgress(plan.recipe, timeout) as progress:
            if cluster is not None:
                from sm120.deploy.cluster import launch_cluster

                ready = launch_cluster(checked, cluster, options, progress.message, progress.update)
            else:
                ready = launch(checked, engine_runtime, options, progress.message, progress.update)
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
    gate_code = run_launch_gate(ready, engine_runtime, gate) if gate else 0
    if gate_code and not (gate and gate.keep_on_fail):
        return gate_code
    banner(ready)
    if gate_code:
        return gate_code
    if foreground:
        return _follow_until_interrupted(ready, engine_runtime)
    return 0


def _runtime(kind: str) -> Runtime:
    if kind == "docker":
        from sm120.engine.runtime.docker import DockerRuntime

        return DockerRuntime()
    return NativeRuntime()


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


def run_launch_gate(ready: Ready, runtime: Runtime, gate: GateRequest) -> int:
    """0 when every case passed; else 1, with the server stopped unless keep_on_fail."""
    from sm120.cli.gates import chosen_cases, run_gate_suites
    from sm120.measure.gate_report import known_failure_lines, summary_line
    from sm120.measure.gates import GateOptions
    from sm120.measure.target import target_for_deployment

    suites = ", ".join(gate.suites)
    sys.stderr.write(f"gate: running {suites} before announcing READY\n")
    failure: str | None = None
    try:
        target = target_for_deployment(ready.state.name)
        reports = run_gate_suites(
            target,
            chosen_cases(list(gate.suites)),
            GateOptions(max_tokens=gate.max_tokens),
            echo=_to_stderr,
        )
    except SM120Error as exc:
        failure = f"the {suites} gate could not run: {exc.one_line()}"
    else:
        for report in reports:
            sys.stderr.write(summary_line(report) + "\n")
            for line in known_failure_lines(report):
                sys.stderr.write(f"  {line}\n")
        failed = [r for r in reports if r["failed"]]
        if failed:
            counts = ", ".join(
                f"{r['suite']} {r['failed']} of {r['failed'] + r['passed']}" for r in failed
            )
            failure = f"the gate failed ({counts} cases failed)"
    if failure is None:
        return 0
    if gate.keep_on_fail:
        sys.stderr.write(f"Error: {failure}; the server keeps running (--keep-on-fail)\n")
        return 1
    from sm120.deploy.monitoring import stop_for

    # The monitor first, as `sm120 stop` does: it must not relaunch what the gate stops.
    stop_for(ready.state.name)
    with deployment_lock(ready.state.name, "stop"):
        runtime.stop(ready.state, timeout=30.0)
        clear_state(ready.state.name)
    sys.stderr.write(
        f"Error: {failure}; the server was stopped (hint: the failed cases are listed above; "
        "--keep-on-fail keeps it running to investigate)\n"
    )
    return 1


def next_commands(name: str) -> list[str]:
    """What the READY banner suggests: chat first, then status, logs and stop."""
    return [
        f'sm120 chat --name {name} "hello"',
        f"sm120 status {name}",
        f"sm120 logs --name {name} -f",
        f"sm120 stop {name}",
    ]


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


def _echo_line(line: str) -> None:
    sys.stderr.write(line + ("\n" if not line.endswith("\n") else ""))


def _follow_until_interrupted(ready: Ready, runtime: Runtime) -> int:
    """--foreground: the launcher lives as long as the engine (what a service unit runs).
    The engine ending on its own is a failure (1) after its leftovers are cleaned up; Ctrl-C
    or SIGTERM stops it through `sm120 stop`'s sequence and is a success (0). Under a monitor
    that restarts the server it follows the deployment through the restarts instead, and the
    breaker giving up ends it with EXIT_GAVE_UP (sm120.deploy.foreground)."""
    from sm120.deploy.foreground import EXIT_GAVE_UP, follow_deployment, monitor_restarts
    from sm120.deploy.notify import notify
    from sm120.deploy.stop import stop_deployment

    state = ready.state
    # READY went to stdout above; whoever reads it through a pipe must see it now.
    sys.stdout.flush()
    notify(f"READY=1\nMAINPID={os.getpid()}")
    try:
        if ready.monitor_pid and monitor_restarts(state.name):
            end = follow_deployment(state.name, _echo_line)
            if end.stopped:
                sys.stderr.write(f"{state.name} was stopped ('sm120 stop')\n")
                return 0
            if end.gave_up:
                sys.stderr.write(
                    f"the engine {end.how} and the restart breaker is open: {state.name} "
                    f"stays stopped (see 'sm120 status {state.name}')\n"
                )
                return EXIT_GAVE_UP
            sys.stderr.write(f"the engine {end.how}\n")
        else:
            for line in runtime.follow(state):
                _echo_line(line)
            info = runtime.exit_info(state)
            sys.stderr.write(f"the engine {info.describe() if info else 'stopped'}\n")
        sys.stderr.write(stop_deployment(state.name).describe() + "\n")
        return 1
    except KeyboardInterrupt:
        notify("STOPPING=1")
        sys.stderr.write("stopping...\n")
        try:
            sys.stderr.write(stop_deployment(state.name).describe() + "\n")
        except SM120Error as exc:
            report(exc)
            return 2
        return 0
    except SM120Error as exc:
        report(exc)
        return 1
