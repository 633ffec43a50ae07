"""The monitor as a process: started detached by `launch` (it outlives the CLI, like the
native supervisor), found again through a locked pid file, stopped by `stop`.

The pid file is locked (flock) for as long as its monitor runs, so "is a monitor running"
never trusts a stale pid that the system has since given to another process.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from sm120.core.pidlock import PidLock, end_holder, lock_holder
from sm120.engine.background import start_detached
from sm120.monitor.files import MonitorFiles, load_settings
from sm120.monitor.lock import take_monitor_lock
from sm120.monitor.poll_loop import MonitorService
from sm120.monitor.watched import DeploymentTarget, Relaunch, UrlTarget

if TYPE_CHECKING:
    from sm120.monitor.watched import Target

MONITOR_MODULE = "sm120.monitor"
STOP_TIMEOUT_S = 60.0
START_WAIT_S = 10.0
START_POLL_S = 0.01


def running_monitor(files: MonitorFiles) -> int | None:
    """The pid of the monitor that holds the lock, or None."""
    return lock_holder(files.pid)


def start_monitor(name: str, files: MonitorFiles, module: str = MONITOR_MODULE) -> int:
    """Start `python -m MODULE --name NAME` in its own session; returns its pid. MODULE is
    this package's, or one that runs `serve` with a relaunch handed in (a higher layer's)."""
    files.make_dirs()
    process = start_detached([sys.executable, "-m", module, "--name", name], files.monitor_log)
    # Wait until it holds its lock, so a `stop` right after a launch finds it. It takes the
    # lock first thing (sm120.monitor.__main__), so this is Python's start, not its imports.
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline and process.poll() is None:
        if running_monitor(files) == process.pid:
            break
        time.sleep(START_POLL_S)
    return process.pid


def stop_monitor(files: MonitorFiles, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM the running monitor and wait for it (SIGKILL after timeout_s); True if one ran.

    A monitor in the middle of a watchdog restart finishes starting the server before it
    exits, so the caller must read the deployment's state again afterwards.
    """
    pid = running_monitor(files)
    if pid is None:
        return False
    end_holder(pid, lambda: running_monitor(files) == pid, timeout_s)
    return True


def serve(
    target_name: str | None,
    files: MonitorFiles,
    *,
    url: str | None = None,
    api_key: str | None = None,
    relaunch: Relaunch | None = None,
    lock: PidLock | None = None,
) -> int:
    """Run the monitor in this process until SIGTERM/SIGINT or the deployment goes away.
    `relaunch` starts the deployment again where one argv cannot (several nodes); `lock` is
    the monitor's lock when the caller took it already (`python -m sm120.monitor`)."""

    files.make_dirs()
    if lock is None:
        lock = take_monitor_lock(files.root)
        if lock is None:
            return 0
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    try:
        target: Target = (
            DeploymentTarget(target_name, files, relaunch=relaunch, cancelled=stop.is_set)
            if target_name
            else UrlTarget(url or "", api_key)
        )
        service = MonitorService(target, files, load_settings(files.settings))
        sys.stderr.write(f"monitoring {target.base_url} (pid {os.getpid()})\n")
        sys.stderr.flush()
        service.run(stop)
    finally:
        lock.release()
    return 0
