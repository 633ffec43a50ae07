"""The monitor's lock: the pid file one monitor at a time holds (locked) while it runs.

Its own small module, importing nothing of the monitor's service, so that `python -m
sm120.monitor` takes the lock before it imports the service (most of a second on a slow
box): a launch waits for the lock, and with it READY, for Python's start only.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sm120.core.pidlock import PidLock, lock_holder
from sm120.engine.state import private_dir


def monitor_pid_path(root: Path) -> Path:
    """The monitor's pid file under a deployment's state dir (or a --state-dir)."""
    return root / "monitor" / "monitor.pid"


def take_monitor_lock(root: Path) -> PidLock | None:
    """The monitor's lock for the state dir `root`, or None (said on stderr) when another
    monitor holds it."""
    path = monitor_pid_path(root)
    private_dir(path.parent)
    lock = PidLock(path)
    if lock.acquire():
        return lock
    sys.stderr.write(f"a monitor already runs for {root} (pid {lock_holder(path)})\n")
    return None
