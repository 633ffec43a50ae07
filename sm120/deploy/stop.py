"""`sm120 stop`: end what a deployment started, under its lock, and forget it.

Only processes the state still provably names are signalled (see sm120.engine.runtime.processes);
a state file that outlived its processes is cleaned up, and the user is told so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sm120.deploy.monitoring import stop_for
from sm120.engine.find import find_deployment, runtime_for
from sm120.engine.runtime.base import ExitInfo
from sm120.engine.state import DeploymentState, clear_state, deployment_lock

# SIGTERM to the engine, then SIGKILL after this long (`sm120 stop --timeout`, --foreground).
STOP_TIMEOUT_S = 30.0


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


def stop_deployment(name: str | None, timeout: float = STOP_TIMEOUT_S) -> Stopped:
    started = time.monotonic()
    found = find_deployment(name)
    # The monitor first: its watchdog must not restart what is being stopped (its restart
    # holds the lock until done). It may have just restarted the server, so the state is
    # read again under the lock.
    stop_for(found.name)
    with deployment_lock(found.name, "stop"):
        state = find_deployment(found.name)
        runtime = runtime_for(state)
        status = runtime.status(state)
        info = runtime.stop(state, timeout=timeout)
        clear_state(state.name)
    return Stopped(state, status.running, status.stale, info, time.monotonic() - started)
