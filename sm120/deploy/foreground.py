"""`launch --foreground` under a monitor that restarts the server: the launcher follows the
deployment, not one engine run, so a relaunch or a watchdog restart does not end it.

Without this, the first restart ended the foreground launcher (its engine was gone), which
then stopped the new server, and systemd started everything again: two supervisors fighting.
Now the launcher keeps printing the one serve.log through every restart and ends only when
the server is dead and the monitor will not bring it back:
- the breaker gave up (the monitor stopped the server for good): EXIT_GAVE_UP, which the
  service unit lists in RestartPreventExitStatus, so systemd respects sm120's breaker;
- the engine ended and no restart is coming (a clean exit, no monitor): as before, the caller
  cleans up and exits 1, and systemd's Restart=on-failure takes over;
- someone ran `sm120 stop`: the state is gone, and that is a success.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sm120.core.pidlock import lock_holder
from sm120.deploy.monitoring import monitor_files
from sm120.engine.find import runtime_for
from sm120.engine.log_follow import LogFollower
from sm120.engine.runtime.base import ExitInfo
from sm120.engine.state import LOCK_FILE, deployment_dir, load_state
from sm120.monitor.files import load_settings
from sm120.monitor.peaks import read_json
from sm120.monitor.process import running_monitor
from sm120.monitor.watchdog import breaker_state_from
from sm120.recipe.restart_policy import is_failure

# The launcher's exit code when the breaker gave up: a service must not start it again.
EXIT_GAVE_UP = 3
POLL_S = 0.5


@dataclass(frozen=True)
class ForegroundEnd:
    how: str
    """How the engine ended, e.g. 'killed by SIGKILL'."""
    gave_up: bool = False
    stopped: bool = False
    """The deployment was stopped (`sm120 stop`), not lost."""


def monitor_restarts(name: str) -> bool:
    """Will the monitor restart this deployment's server (on death or on a wedge)?"""
    settings = load_settings(monitor_files(name).settings)
    return settings.restart_on_death or settings.restart_on_wedge


def restart_pending(name: str, exit_info: ExitInfo | None) -> bool:
    """The server is down, but the monitor is restarting it or is about to."""
    files = monitor_files(name)
    monitor = running_monitor(files)
    if monitor is None:
        return False
    if lock_holder(deployment_dir(name) / LOCK_FILE) == monitor:
        return True  # a restart is under way
    if breaker_state_from(read_json(files.watchdog)).gave_up_at is not None:
        return False
    failed = exit_info is None or is_failure(exit_info.returncode, exit_info.signal)
    return load_settings(files.settings).restart_on_death and failed


def follow_deployment(name: str, write: Callable[[str], None]) -> ForegroundEnd:
    """Write serve.log's lines as they come, across restarts, until the server is down for
    good (see the module's docstring)."""
    state = load_state(name)
    if state is None:
        return ForegroundEnd("was stopped", stopped=True)
    follower = LogFollower(Path(state.log_path))
    try:
        while True:
            for line in follower.read_lines():
                write(line)
            state = load_state(name)
            if state is None:
                return ForegroundEnd("was stopped", stopped=True)
            runtime = runtime_for(state)
            status = runtime.status(state)
            exit_info = status.exit or runtime.exit_info(state)
            if status.running or restart_pending(name, exit_info):
                time.sleep(POLL_S)
                continue
            for line in [*follower.read_lines(), *follower.rest()]:
                write(line)
            breaker = breaker_state_from(read_json(monitor_files(name).watchdog))
            how = exit_info.describe() if exit_info else "stopped"
            return ForegroundEnd(how, gave_up=breaker.gave_up_at is not None)
    finally:
        follower.close()
