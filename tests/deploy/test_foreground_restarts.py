"""When `launch --foreground` keeps waiting for the monitor to bring a dead server back, and
when it gives up waiting (the real relaunch under --foreground is in
tests/integration/test_relaunch_realstack.py). This process plays the monitor by holding its
pid lock, as a running monitor does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sm120.core.pidlock import PidLock
from sm120.deploy.foreground import monitor_restarts, restart_pending
from sm120.deploy.monitoring import monitor_files
from sm120.engine.runtime.base import ExitInfo
from sm120.engine.state import LOCK_FILE, deployment_dir
from sm120.monitor.files import MonitorSettings

KILLED = ExitInfo(returncode=None, signal=9, ended_at=0.0)
TERMINATED = ExitInfo(returncode=None, signal=15, ended_at=0.0)


@pytest.fixture
def monitor(isolated_home: Path) -> Iterator[PidLock]:
    files = monitor_files("tiny")
    files.make_dirs()
    MonitorSettings(restart_on_death=True, restart_policy="on-failure").save(files.settings)
    lock = PidLock(files.pid)
    assert lock.acquire()
    yield lock
    lock.release()


def test_a_failed_engine_under_a_running_monitor_is_waited_for(monitor: PidLock) -> None:
    assert monitor_restarts("tiny")
    assert restart_pending("tiny", KILLED)
    assert restart_pending("tiny", None)  # vanished: a failure too
    assert not restart_pending("tiny", TERMINATED)  # a stop is not relaunched


def test_no_wait_once_the_breaker_is_open(monitor: PidLock) -> None:
    monitor_files("tiny").watchdog.write_text(json.dumps({"restarts": [1.0], "gave_up_at": 2.0}))
    assert not restart_pending("tiny", KILLED)


def test_no_wait_without_a_monitor(monitor: PidLock) -> None:
    monitor.release()
    assert not restart_pending("tiny", KILLED)


def test_a_restart_under_way_is_waited_for_whatever_the_policy(monitor: PidLock) -> None:
    MonitorSettings(restart_on_wedge=True).save(monitor_files("tiny").settings)
    assert monitor_restarts("tiny")
    assert not restart_pending("tiny", TERMINATED)
    # The monitor holds the deployment's lock while it stops and starts the server.
    with PidLock(deployment_dir("tiny") / LOCK_FILE) as restarting:
        assert restarting.acquire()
        assert restart_pending("tiny", TERMINATED)
    assert not restart_pending("tiny", TERMINATED)


def test_a_monitor_that_never_restarts_leaves_the_old_foreground(isolated_home: Path) -> None:
    files = monitor_files("tiny")
    files.make_dirs()
    MonitorSettings().save(files.settings)
    assert not monitor_restarts("tiny")
