"""Ending a deployment: the one stop sequence, and `sm120 stop` on top of it.

Every path that ends a deployment - `sm120 stop`, --replace, a failed launch, a failed
--gate, --foreground ending - goes through `stop_sequence`: the monitor first (its watchdog
must not restart what is being stopped), then the runtime, then the state. Only processes
the state still provably names are signalled (see sm120.engine.runtime.processes); a state
file that outlived its processes is cleaned up, and the user is told so.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from sm120.core.defaults import STOP_TIMEOUT_S
from sm120.deploy.monitoring import stop_for
from sm120.engine.find import find_deployment, runtime_for
from sm120.engine.runtime.base import ExitInfo, Runtime
from sm120.engine.state import DeploymentState, clear_state, deployment_lock, load_state


@dataclass(frozen=True)
class Stopped:
    state: DeploymentState
    was_running: bool
    # Nothing was recorded as ended and nothing the state names is ours: only the file was.
    stale: bool
    exit: ExitInfo | None
    seconds: float

    def describe(self) -> str:
        name, took = self.state.name, f"{self.seconds:.1f}s"
        if self.stale:
            return (
                f"cleaned up {name}: process {self.state.supervisor_pid} named in its state "
                "is gone or is not one sm120 started, so nothing was signalled"
            )
        how = self.exit.describe() if self.exit else "ended"
        verb = "stopped" if self.was_running else "cleaned up (it had already ended)"
        return f"{verb} {name}: the engine {how} after {took}; port {self.state.port} is free"


def stop_sequence(
    state: DeploymentState,
    *,
    runtime: Runtime | None = None,
    timeout: float = STOP_TIMEOUT_S,
    lock_held: bool = False,
) -> Stopped:
    """Monitor, then runtime, then state. `runtime` is the one that started the engine when
    the caller has it (else the state names it); `lock_held` when the caller already holds
    the deployment's lock (a launch replacing or cleaning up its own)."""
    started = time.monotonic()
    # Outside the lock: a monitor in the middle of a restart holds it until the server is
    # up again, and only then exits.
    stop_for(state.name)
    lock = contextlib.nullcontext() if lock_held else deployment_lock(state.name, "stop")
    with lock:
        # Read again: the monitor may have just restarted the server under a new process.
        current = load_state(state.name) or state
        engine = runtime or runtime_for(current)
        status = engine.status(current)
        info = engine.stop(current, timeout=timeout)
        clear_state(current.name)
    return Stopped(current, status.running, status.stale, info, time.monotonic() - started)


def stop_deployment(name: str | None, timeout: float = STOP_TIMEOUT_S) -> Stopped:
    """`sm120 stop [NAME]`: the named deployment, or the only one there is."""
    return stop_sequence(find_deployment(name), timeout=timeout)
