"""Serving a checked plan: pick the runtime, start it (one host or many) under the caller's
progress view, run the --gate, announce READY, and with --foreground stay until the engine
ends or the launcher is told to stop.

What the user sees is the caller's (`ServeView`, in the CLI: progress, banner, one-line
errors); what happens, and every exit code, is decided here.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from sm120.core.errors import SM120Error
from sm120.deploy.checked import CheckedPlan
from sm120.deploy.cluster import ClusterRequest, launch_cluster
from sm120.deploy.foreground import EXIT_GAVE_UP, follow_deployment, monitor_restarts
from sm120.deploy.gate import GateRequest, run_launch_gate
from sm120.deploy.launcher import LaunchOptions, Ready, describe_failure, launch
from sm120.deploy.notify import notify
from sm120.deploy.stop import stop_deployment
from sm120.deploy.wait import StartupFailed
from sm120.engine.cluster.runtime import ClusterRuntime
from sm120.engine.runtime.base import Runtime
from sm120.engine.runtime.docker import DockerRuntime
from sm120.engine.runtime.native import NativeRuntime
from sm120.logs.phases import PhaseUpdate

# Exit codes of a launch, beside 0 (serving) and EXIT_GAVE_UP (sm120.deploy.foreground).
EXIT_FAILED = 1  # the gate failed, or the engine ended under --foreground
EXIT_ERROR = 2  # it did not start; the one-line error says why
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM while starting; everything was stopped


class StartView(Protocol):
    """Progress while the engine starts."""

    def message(self, text: str) -> None: ...

    def update(self, update: PhaseUpdate | None, elapsed: float) -> None: ...

    def provisioning(self, what: str) -> AbstractContextManager[Callable[[str], None]]:
        """A phase of its own before the engine starts: installing the managed engine."""
        ...

    def asking(self, confirm: Callable[[str], bool] | None) -> Callable[[str], bool] | None:
        """`confirm`, asked with the live progress out of the way (a question under a
        running "starting the engine 83s" line reads as progress, not as a question)."""
        ...


class ServeView(Protocol):
    """What the user sees of serving."""

    def line(self, text: str) -> None:
        """One line of progress or engine output, on stderr."""

    def starting(self, what: str, timeout_s: float) -> AbstractContextManager[StartView]:
        """Progress from the start until READY (or the failure)."""
        ...

    def error(self, exc: SM120Error) -> None:
        """The one-line error with its hint."""

    def ready(self, ready: Ready) -> None:
        """The READY banner."""


def runtime_named(kind: str) -> Runtime:
    """--runtime native or docker (checked when the request was built)."""
    return DockerRuntime() if kind == "docker" else NativeRuntime()


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve(
    checked: CheckedPlan,
    options: LaunchOptions,
    *,
    view: ServeView,
    runtime: str = "native",
    foreground: bool = False,
    gate: GateRequest | None = None,
    cluster: ClusterRequest | None = None,
) -> int:
    """Start the plan and report READY; the exit code of the launch."""
    # --runtime applies per node (SSH or Docker over ssh://), inside the cluster runtime.
    engine: Runtime = ClusterRuntime() if cluster is not None else runtime_named(runtime)
    plan = checked.plan
    # SIGTERM to the launcher (e.g. a CI timeout) cleans up like Ctrl-C does.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    timeout = options.timeout_s or plan.timeouts.ready_s
    try:
        with view.starting(plan.recipe, timeout) as progress:
            if cluster is not None:
                ready = launch_cluster(checked, cluster, options, progress.message, progress.update)
            else:
                options.provision_view = progress.provisioning
                options.confirm = progress.asking(options.confirm)
                ready = launch(checked, engine, options, progress.message, progress.update)
    except StartupFailed as exc:
        for line in describe_failure(exc):
            view.line(line)
        view.error(exc)
        return EXIT_ERROR
    except KeyboardInterrupt:
        what = "every node was stopped" if cluster else "the engine was stopped"
        view.line(f"interrupted: {what} and nothing is left running")
        return EXIT_INTERRUPTED
    except SM120Error as exc:
        view.error(exc)
        return EXIT_ERROR
    try:
        gate_code = 0
        if gate:
            gate_started = time.monotonic()
            gate_code = run_launch_gate(ready, engine, gate, view.line)
            ready.add_step("gate", time.monotonic() - gate_started)
        if gate_code and not (gate and gate.keep_on_fail):
            return gate_code
        view.ready(ready)
        if gate_code:
            return gate_code
        if foreground:
            return follow_until_interrupted(ready, engine, view)
    except KeyboardInterrupt:
        # Between a healthy start and the command's end (the gate, the banner, the step into
        # following it): the command has not handed the engine over yet, so it stops it.
        return _stop_interrupted(ready, view, 0 if foreground else EXIT_INTERRUPTED)
    return 0


def _stop_interrupted(ready: Ready, view: ServeView, code: int) -> int:
    notify("STOPPING=1")
    view.line("stopping...")
    try:
        view.line(stop_deployment(ready.state.name).describe())
    except SM120Error as exc:
        view.error(exc)
        return EXIT_ERROR
    return code


def follow_until_interrupted(ready: Ready, runtime: Runtime, view: ServeView) -> int:
    """--foreground: the launcher lives as long as the engine (what a service unit runs).
    The engine ending on its own is a failure (1) after its leftovers are cleaned up; Ctrl-C
    or SIGTERM stops it through `sm120 stop`'s sequence and is a success (0). Under a monitor
    that restarts the server it follows the deployment through the restarts instead, and the
    breaker giving up ends it with EXIT_GAVE_UP (sm120.deploy.foreground)."""
    state = ready.state
    try:
        # Inside the try: a SIGTERM sent the moment READY=1 arrives may land while this call
        # is still closing its socket (seen in CI: exit 130, the engine left running).
        notify(f"READY=1\nMAINPID={os.getpid()}")
        if ready.monitor_pid and monitor_restarts(state.name):
            end = follow_deployment(state.name, view.line)
            if end.stopped:
                view.line(f"{state.name} was stopped ('sm120 stop')")
                return 0
            if end.gave_up:
                view.line(
                    f"the engine {end.how} and the restart breaker is open: {state.name} "
                    f"stays stopped (see 'sm120 status {state.name}')"
                )
                return EXIT_GAVE_UP
            view.line(f"the engine {end.how}")
        else:
            for line in runtime.follow(state):
                view.line(line)
            info = runtime.exit_info(state)
            view.line(f"the engine {info.describe() if info else 'stopped'}")
        view.line(stop_deployment(state.name).describe())
        return EXIT_FAILED
    except KeyboardInterrupt:
        return _stop_interrupted(ready, view, 0)
    except SM120Error as exc:
        view.error(exc)
        return EXIT_FAILED
