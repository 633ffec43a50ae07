"""Relaunching a deployment over several nodes, with the stand-ins of tests/fakes/cluster.py
(ssh runs the command here, a fake engine replaces vLLM); the agent, the aggregator, the
monitor, its breaker and every start and stop are the real ones. A killed worker brings
every node down and up again in order; the breaker opens after N and leaves nothing
running, also under `launch --foreground`, which stays attached through a relaunch;
`sm120 stop` never relaunches, also when it lands in the middle of a relaunch; a
relaunch told to stop between its steps ends with nothing started. The real engine across
two hosts is tests/integration/test_multinode_netns.py."""

from __future__ import annotations

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

from sm120.core.pidlock import lock_holder
from sm120.deploy.cluster import RelaunchCancelled, relaunch_cluster
from sm120.deploy.cluster_start import load_cluster_start
from sm120.deploy.foreground import EXIT_GAVE_UP
from sm120.deploy.monitoring import stop_for
from sm120.engine.cluster.record import load_record
from sm120.engine.runtime.processes import group_members
from sm120.engine.state import LOCK_FILE, DeploymentState, load_state
from sm120.monitor.files import MonitorFiles
from sm120.monitor.process import running_monitor
from tests.fakes.cluster import FakeCluster, make_fake_cluster
from tests.helpers import free_port
from tests.integration.realstack import wait_for

FAST = ("--set", "monitor.poll_s=1", "--set", "monitor.restart_backoff_s=1")


class Cluster:
    def __init__(self, fake: FakeCluster, home: Path) -> None:
        self.fake = fake
        self.home = home
        self.port = free_port()
        self.master_port = free_port()
        self.files = MonitorFiles(home / "deployments" / "tiny")
        self.aggregators: set[int] = set()

    def sm120(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sm120", *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def launch_argv(self, *args: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "sm120",
            "launch",
            "tiny",
            "-V",
            "2node",
            "--nodes",
            "node-a,node-b",
            "--set",
            "multinode.socket_ifname=lo",
            "--set",
            f"multinode.master_port={self.master_port}",
            "--port",
            str(self.port),
            "--model-dir",
            str(self.fake.model),
            "--vllm-python",
            str(self.fake.python),
            "--timeout",
            "60",
            *FAST,
            *args,
        ]

    def env(self) -> dict[str, str]:
        return {**os.environ, "SM120_HOME": str(self.home), "NO_COLOR": "1"}

    def launch(self, *args: str) -> None:
        launched = subprocess.run(
            self.launch_argv(*args),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert launched.returncode == 0, launched.stderr[-3000:]

    def state(self) -> dict[str, Any] | None:
        path = self.home / "deployments" / "tiny" / "state.json"
        state = json.loads(path.read_text()) if path.is_file() else None
        if state is not None:
            self.aggregators.add(int(state["supervisor_pid"]))
        return state

    def engines(self, marker: bytes = b"") -> list[int]:
        """Fake ranks of this cluster still running (their argv names our ports)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ours = str(self.master_port).encode() in argv
            if ours and any(b"cluster_fake_engine" in a for a in argv) and marker in argv:
                found.append(int(entry.name))
        return found

    def worker(self) -> int:
        (pid,) = wait_for("the worker", lambda: self.engines(b"--headless"), 30)
        return pid

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def starts(self) -> list[str]:
        return [c.split()[0] for c in self.fake.ssh_calls() if c.endswith(" start")]

    def events(self, kind: str) -> list[dict[str, Any]]:
        if not self.files.events.exists():
            return []
        found = [json.loads(line) for line in self.files.events.read_text().splitlines()]
        return [event for event in found if event["kind"] == kind]

    def status(self) -> dict[str, Any]:
        result = self.sm120("status", "tiny", "--json")
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout)[0])

    def assert_nothing_running(self) -> None:
        wait_for("every fake rank to end", lambda: not self.engines(), 15, every=0.1)
        assert not self.fake.run_root.exists() or list(self.fake.run_root.iterdir()) == []
        for aggregator in self.aggregators:
            assert group_members(aggregator) == []


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    made = Cluster(make_fake_cluster(tmp_path, monkeypatch), tmp_path / "home")
    monkeypatch.setenv("SM120_HOME", str(made.home))  # for the calls made in this process
    yield made
    if made.state() is not None:
        made.sm120("stop", "--timeout", "5")
    monitor = running_monitor(made.files)
    if monitor is not None:
        os.kill(monitor, signal.SIGKILL)


def test_a_killed_worker_relaunches_every_node_and_stop_ends_it(cluster: Cluster) -> None:
    cluster.launch("--restart", "on-failure:2")
    first = cluster.state()
    assert first is not None
    wait_for("the monitor", lambda: running_monitor(cluster.files), 30)
    head = cluster.engines(b"--port")

    os.kill(cluster.worker(), signal.SIGKILL)
    wait_for(
        "the relaunch",
        lambda: (s := cluster.state()) and s["supervisor_pid"] != first["supervisor_pid"],
        60,
    )
    wait_for("READY again", cluster.healthy, 60, every=0.2)
    # Every node went down and came up again, workers first: the head was not left alone.
    assert cluster.starts() == ["node-b", "node-a", "node-b", "node-a"]
    assert not set(head) & set(cluster.engines())
    assert group_members(first["supervisor_pid"]) == []  # the first run's aggregator

    watchdog = cluster.status()["monitor"]["watchdog"]
    assert (watchdog["breaker"], watchdog["restarts_in_window"]) == ("closed", 1)
    (record,) = watchdog["restarts"]
    assert (record["kind"], record["reason"]) == ("died", "node1:engine killed by SIGKILL")
    assert "[node1:engine] headless worker rank 1 waiting for 127.0.0.1" in record["log_tail"]
    assert not any(line.startswith("[node0:") for line in record["log_tail"])
    (restart,) = cluster.events("restart")
    assert restart["message"] == (
        "node1:engine killed by SIGKILL: relaunching the server (watchdog restart 1 of 2)"
    )
    chat = cluster.sm120("chat", "hello", "--max-tokens", "8")
    assert chat.returncode == 0 and chat.stdout.strip() == "READY"

    stopped = cluster.sm120("stop")
    assert stopped.returncode == 0, stopped.stderr
    time.sleep(3)  # three of the monitor's polls
    assert cluster.state() is None and running_monitor(cluster.files) is None
    assert len(cluster.events("restart")) == 1
    cluster.assert_nothing_running()


def test_the_breaker_opens_after_n_and_leaves_every_node_stopped(cluster: Cluster) -> None:
    cluster.launch("--restart", "on-failure:1")
    first = cluster.state()
    assert first is not None
    wait_for("the monitor", lambda: running_monitor(cluster.files), 30)
    os.kill(cluster.worker(), signal.SIGKILL)
    wait_for(
        "the relaunch",
        lambda: (s := cluster.state()) and s["supervisor_pid"] != first["supervisor_pid"],
        60,
    )
    wait_for("READY again", cluster.healthy, 60, every=0.2)
    second = cluster.state()

    os.kill(cluster.worker(), signal.SIGKILL)
    wait_for("the monitor to give up", lambda: running_monitor(cluster.files) is None, 60)
    cluster.assert_nothing_running()  # the head too: the breaker stopped every node
    assert cluster.state() == second  # kept, so status tells what happened
    (gave_up,) = cluster.events("gave_up")
    assert gave_up["message"] == (
        "gave up: node1:engine killed by SIGKILL after 1 watchdog restarts in the last 6 h "
        "(limit 1); not relaunching again (F26)"
    )
    row = cluster.status()
    assert row["running"] is False
    assert (row["monitor"]["watchdog"]["breaker"], len(row["monitor"]["watchdog"]["restarts"])) == (
        "open",
        1,
    )
    assert "GAVE UP" in cluster.sm120("status", "tiny").stdout
    assert cluster.starts() == ["node-b", "node-a", "node-b", "node-a"]
    stopped = cluster.sm120("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert cluster.state() is None


def test_foreground_stays_through_a_relaunch_and_ends_when_the_breaker_opens(
    cluster: Cluster, tmp_path: Path
) -> None:
    # What the service unit runs: the launcher follows the deployment across nodes.
    err_path = tmp_path / "foreground.err"
    with err_path.open("w") as err:
        process = subprocess.Popen(
            cluster.launch_argv("--restart", "on-failure:1", "--foreground"),
            env=cluster.env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for("READY", cluster.healthy, 60, every=0.2)
        wait_for("the monitor", lambda: running_monitor(cluster.files), 30)
        first = cluster.state()
        assert first is not None
        os.kill(cluster.worker(), signal.SIGKILL)
        wait_for(
            "the relaunch",
            lambda: (s := cluster.state()) and s["supervisor_pid"] != first["supervisor_pid"],
            60,
        )
        wait_for("READY again", cluster.healthy, 60, every=0.2)
        assert process.poll() is None  # the relaunch did not end the foreground launcher
        os.kill(cluster.worker(), signal.SIGKILL)
        assert process.wait(timeout=60) == EXIT_GAVE_UP
        text = err_path.read_text()
        assert "the restart breaker is open: tiny stays stopped" in text
        # One log through both runs: the head answered READY twice.
        assert text.count("[node0:engine] INFO:     Application startup complete.") == 2
        cluster.assert_nothing_running()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_stop_during_a_relaunch_leaves_nothing_on_any_node(cluster: Cluster) -> None:
    cluster.launch("--restart", "on-failure:2")
    first = cluster.state()
    assert first is not None
    monitor = wait_for("the monitor", lambda: running_monitor(cluster.files), 30)
    lock = cluster.home / "deployments" / "tiny" / LOCK_FILE

    os.kill(cluster.worker(), signal.SIGKILL)
    # The monitor holds the deployment's lock while it relaunches: stop right then.
    wait_for("the relaunch to begin", lambda: lock_holder(lock) == monitor, 30, every=0.01)
    stopped = cluster.sm120("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert cluster.state() is None and running_monitor(cluster.files) is None
    time.sleep(2)
    cluster.assert_nothing_running()
    assert len(cluster.events("restart")) == 1


def test_a_cancelled_relaunch_stops_what_it_started(cluster: Cluster) -> None:
    cluster.launch("--restart", "on-failure:2")
    stop_for("tiny")  # this test relaunches by hand, in this process
    start = load_cluster_start("tiny")
    state = load_state("tiny")
    assert start is not None and state is not None
    cluster.aggregators.add(state.supervisor_pid)
    said: list[str] = []
    asked = 0

    def cancelled() -> bool:
        # Asked at the start, after the stop, after preflight, then before each process:
        # the fifth time is after the worker started again, before the head.
        nonlocal asked
        asked += 1
        return asked == 5

    with pytest.raises(RelaunchCancelled) as caught:
        relaunch_cluster(start, state, said.append, cancelled=cancelled)
    assert caught.value.one_line() == (
        "the deployment was stopped during its relaunch (hint: nothing of it is left running)"
    )
    assert said[-2:] == ["starting engine on node1 (node-b)", "stopping every node"]
    assert cluster.starts() == ["node-b", "node-a", "node-b"]
    relaunched = load_state("tiny")
    assert isinstance(relaunched, DeploymentState)
    assert relaunched.supervisor_pid != state.supervisor_pid  # kept for status and stop
    cluster.aggregators.add(relaunched.supervisor_pid)
    record = load_record("tiny")
    assert record is not None and record.processes == []
    cluster.assert_nothing_running()
