"""`--restart on-failure:N` against the real vLLM (CPU build) serving the tiny model: the
engine killed with SIGKILL is relaunched to READY with the restart recorded (reason, last log
lines); `sm120 stop` after that never causes a relaunch; under `launch --foreground` a
relaunch keeps the launcher attached, and the next death trips the breaker (N=1): the
deployment is left cleanly stopped, status shows the breaker open, and the launcher exits
with the code the service unit does not restart.

One deployment serves the first two tests (in order); polls every second, 1 s backoff.
Four engine starts in all, to keep the module short on CI's two cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sm120.deploy.foreground import EXIT_GAVE_UP
from sm120.engine.runtime.processes import group_members
from sm120.monitor.files import MonitorFiles
from sm120.monitor.process import running_monitor
from tests.helpers import free_port, port_is_free
from tests.integration.realstack import cli_env, engine_processes, sm120, state_of, wait_for

pytestmark = pytest.mark.integration

START_WAIT_S = 900.0  # a start takes ~45 s on an idle 2-core box, minutes on a busy one
FAST = ("--set", "monitor.poll_s=1", "--set", "monitor.restart_backoff_s=1")


class Deployment:
    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.files = MonitorFiles(home / "deployments" / "tiny")
        self.groups: set[int] = set()

    def state(self) -> dict[str, Any] | None:
        state = state_of(self.home)
        if state is not None:
            self.groups.add(state["supervisor_pid"])
        return state

    def events(self, kind: str) -> list[dict[str, Any]]:
        path = self.files.events
        if not path.exists():
            return []
        found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [event for event in found if event["kind"] == kind]

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def status(self) -> dict[str, Any]:
        result = sm120(self.home, "status", "tiny", "--json")
        assert result.returncode == 0, result.stderr
        rows = json.loads(result.stdout)
        assert len(rows) == 1
        return dict(rows[0])

    def next_group(self, after: int) -> int:
        """Wait for the monitor to start a new engine; its supervisor's pid."""
        state = wait_for(
            "a relaunched engine",
            lambda: (s := self.state()) and s["supervisor_pid"] != after and s["engine_pid"] and s,
            120,
            every=0.2,
        )
        return int(state["supervisor_pid"])

    def cleanup(self) -> None:
        sm120(self.home, "stop", "tiny", "--timeout", "10")
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        monitor = running_monitor(self.files)
        if monitor:
            os.kill(monitor, signal.SIGKILL)


def launch(home: Path, tiny_model: Path, *extra: str) -> Deployment:
    deployment = Deployment(home, free_port())
    launched = sm120(
        home,
        "launch",
        "tiny",
        "--port",
        str(deployment.port),
        "--model-dir",
        str(tiny_model),
        *FAST,
        *extra,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert deployment.state() is not None
    return deployment


def assert_nothing_running(deployment: Deployment) -> None:
    wait_for("the engine to go", lambda: not engine_processes(deployment.port), 30)
    for group in deployment.groups:
        assert group_members(group) == []
    assert port_is_free(deployment.port)


@pytest.fixture(scope="module")
def relaunching(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Deployment]:
    deployment = launch(tmp_path_factory.mktemp("home"), tiny_model, "--restart", "on-failure:2")
    try:
        yield deployment
    finally:
        deployment.cleanup()


def test_a_killed_engine_is_relaunched_and_the_restart_recorded(relaunching: Deployment) -> None:
    first = relaunching.state()
    assert first is not None
    wait_for("the monitor", lambda: running_monitor(relaunching.files), 30)
    os.kill(first["engine_pid"], signal.SIGKILL)

    relaunching.next_group(first["supervisor_pid"])
    wait_for("the relaunched server to be ready", relaunching.healthy, START_WAIT_S, every=2)
    assert group_members(first["supervisor_pid"]) == []  # nothing of the killed run is left

    watchdog = relaunching.status()["monitor"]["watchdog"]
    assert watchdog["restart_policy"] == "on-failure:2"
    assert watchdog["breaker"] == "closed" and watchdog["max_restarts"] == 2
    assert watchdog["restarts_in_window"] == 1
    (record,) = watchdog["restarts"]
    assert record["kind"] == "died"
    assert record["reason"] == "the engine killed by SIGKILL"
    # The killed run's last words, each line as the engine printed it.
    assert record["log_tail"] and len(record["log_tail"]) <= 20
    assert any(f"pid={first['engine_pid']})" in line for line in record["log_tail"])
    (restart,) = relaunching.events("restart")
    assert restart["message"] == (
        "the engine killed by SIGKILL: relaunching the server (watchdog restart 1 of 2)"
    )
    text = sm120(relaunching.home, "status", "tiny").stdout
    assert "  restart   policy on-failure:2, breaker closed" in text
    assert "died: the engine killed by SIGKILL" in text


def test_stop_after_a_relaunch_never_relaunches(relaunching: Deployment) -> None:
    wait_for("the relaunched server to be ready", relaunching.healthy, START_WAIT_S, every=2)
    assert running_monitor(relaunching.files) is not None
    result = sm120(relaunching.home, "stop", "tiny")
    assert result.returncode == 0, result.stderr
    # Several of the monitor's polls later: still nothing, and nothing was relaunched.
    time.sleep(5)
    assert relaunching.state() is None
    assert running_monitor(relaunching.files) is None
    assert len(relaunching.events("restart")) == 1  # test 1's, no other
    assert_nothing_running(relaunching)


def test_foreground_stays_through_a_relaunch_and_ends_when_the_breaker_opens(
    tmp_path: Path, tiny_model: Path
) -> None:
    deployment = Deployment(tmp_path / "home", free_port())
    command = [sys.executable, "-m", "sm120", "launch", "tiny", "--port", str(deployment.port)]
    command += ["--model-dir", str(tiny_model), *FAST, "--restart", "on-failure:1"]
    err_path = tmp_path / "stderr.log"
    with err_path.open("w") as err:
        process = subprocess.Popen(
            [*command, "--foreground"],
            env=cli_env(deployment.home),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for("READY", deployment.healthy, START_WAIT_S, every=2)
        wait_for("the monitor", lambda: running_monitor(deployment.files), 60)
        first = deployment.state()
        assert first is not None
        os.kill(first["engine_pid"], signal.SIGKILL)
        group = deployment.next_group(first["supervisor_pid"])
        wait_for("the relaunched server to be ready", deployment.healthy, START_WAIT_S, every=2)
        assert process.poll() is None  # the relaunch did not end the foreground launcher

        again = deployment.state()
        assert again is not None and again["supervisor_pid"] == group
        os.kill(again["engine_pid"], signal.SIGKILL)
        assert process.wait(timeout=120) == EXIT_GAVE_UP
        text = err_path.read_text()
        assert "the restart breaker is open: tiny stays stopped" in text
        # The one log went on through the relaunch: both runs' startups are in the output.
        assert text.count("Application startup complete.") == 2
        wait_for("the monitor to end", lambda: running_monitor(deployment.files) is None, 60)
        assert_nothing_running(deployment)

        # The breaker opened at its limit: recorded, shown, and the deployment left stopped.
        assert deployment.state()["supervisor_pid"] == group  # no second relaunch
        (gave_up,) = deployment.events("gave_up")
        assert gave_up["message"] == (
            "gave up: the server killed by SIGKILL after 1 watchdog restarts in the last 6 h "
            "(limit 1); not relaunching again (F26)"
        )
        row = deployment.status()
        assert row["running"] is False and row["exit"] == "killed by SIGKILL"
        watchdog = row["monitor"]["watchdog"]
        assert watchdog["breaker"] == "open" and watchdog["restarts_in_window"] == 1
        assert [record["kind"] for record in watchdog["restarts"]] == ["died"]
        assert "GAVE UP" in sm120(deployment.home, "status", "tiny").stdout
        stopped = sm120(deployment.home, "stop", "tiny")
        assert stopped.returncode == 0 and "cleaned up (it had already ended)" in stopped.stdout
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        deployment.cleanup()
