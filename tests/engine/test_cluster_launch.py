"""`sm120 launch --nodes` end to end with two stand-ins: ssh runs the remote command here and a
fake engine replaces vLLM (tests/fakes/cluster.py). Everything else is the real thing: the CLI,
preflight, the node agent, start order, the log aggregator, READY, chat, status, stop, and the
cleanup of every node when a start fails. The real engine across two hosts is
tests/integration/test_multinode_netns.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sm120.engine.runtime.processes import group_members
from tests.fakes.cluster import FakeCluster, make_fake_cluster
from tests.fakes.standin import FAILURE_LINE, FATAL_STARTUPS
from tests.helpers import free_port


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    return make_fake_cluster(tmp_path, monkeypatch)


class Cluster:
    def __init__(self, fake: FakeCluster, home: Path) -> None:
        self.fake = fake
        self.home = home
        self.port = free_port()
        self.master_port = free_port()

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SM120_HOME=str(self.home), NO_COLOR="1", **extra)
        return env

    def sm120(
        self, *args: str, timeout: float = 120, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sm120", *args],
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def launch(
        self, *args: str, nodes: str = "node-a,node-b", variant: str = "2node", **extra: str
    ) -> subprocess.CompletedProcess[str]:
        return self.sm120(
            "launch",
            "tiny",
            "-V",
            variant,
            "--nodes",
            nodes,
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
            "--ssh-option",
            "StrictHostKeyChecking=no",
            "--timeout",
            "60",
            *args,
            **extra,
        )

    def engine_processes(self) -> list[int]:
        """Fake ranks of this cluster still running (their argv names our master port)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ours = str(self.master_port).encode() in argv or any(
                str(self.port).encode() in arg for arg in argv
            )
            fake = any(b"cluster_fake_engine" in arg for arg in argv)
            if fake and ours:
                found.append(int(entry.name))
        return found

    def state(self) -> dict[str, object] | None:
        path = self.home / "deployments" / "tiny" / "state.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def assert_nothing_left(self, aggregator: int | None = None) -> None:
        deadline = time.monotonic() + 10
        while self.engine_processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.engine_processes() == []
        assert not self.fake.run_root.exists() or list(self.fake.run_root.iterdir()) == []
        assert self.state() is None
        if aggregator is not None:
            assert group_members(aggregator) == []


@pytest.fixture
def cluster(fake: FakeCluster, tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(fake, tmp_path / "home")
    yield made
    if made.state() is not None:
        made.sm120("stop", "--timeout", "5")


# The fake engine plays Ray's part; the real CPU build refuses the Ray executor (rule S08).
RAY = ("--force", "S08", "--set", "multinode.executor=ray", "--set")


def starts(fake: FakeCluster) -> list[str]:
    """Hosts of the agent 'start' calls, in order."""
    return [call.split()[0] for call in fake.ssh_calls() if call.endswith(" start")]


def test_launch_chat_status_logs_stop(cluster: Cluster) -> None:
    launched = cluster.launch()
    assert launched.returncode == 0, launched.stderr
    assert "READY tiny answered: 'READY'" in launched.stdout
    assert f"endpoint  http://127.0.0.1:{cluster.port}/v1" in launched.stdout
    # native order: the headless worker first, then rank 0 on the head
    assert starts(cluster.fake) == ["node-b", "node-a"]
    assert "preflight: probing 2 nodes" in launched.stderr

    status = json.loads(cluster.sm120("status", "--json").stdout)[0]
    assert status["running"] and status["runtime"] == "cluster"
    assert status["nodes"] == ["node-a", "node-b"]
    assert status["health"] == 200
    text = cluster.sm120("status").stdout
    assert "nodes     node-a, node-b (head first)" in text

    chat = cluster.sm120("chat", "hello", "--max-tokens", "8")
    assert chat.returncode == 0 and chat.stdout.strip() == "READY"

    logs = cluster.sm120("logs", "-n", "200").stdout
    assert "[node1:engine] headless worker rank 1 waiting for 127.0.0.1" in logs
    assert "[node0:engine] Starting vLLM API server" in logs
    assert "[node1:engine] fake rank 1 up, interface lo" in logs

    aggregator = int(cluster.state()["supervisor_pid"])  # type: ignore[call-overload,index]
    stopped = cluster.sm120("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("stopped tiny: the engine exited with code 0")
    cluster.assert_nothing_left(aggregator)


def test_api_key_reaches_only_the_head_and_no_command_line(cluster: Cluster) -> None:
    assert cluster.launch("--api-key", "sekrit-key-123").returncode == 0
    assert "sekrit-key-123" not in cluster.fake.ssh_command_lines()
    for pid in cluster.engine_processes():
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"sekrit" not in argv
        assert (b"VLLM_API_KEY=sekrit-key-123" in environ) == (b"--headless" not in argv)


def test_head_exiting_stops_every_node(cluster: Cluster) -> None:
    launched = cluster.launch(FAKE_ENGINE="head-exits")
    assert launched.returncode == 2
    assert "RuntimeError: Engine core initialization failed." in launched.stderr
    assert "Error: the engine exited with code 3 before it was ready" in launched.stderr
    assert "stopping every node" in launched.stderr
    cluster.assert_nothing_left()


def test_a_lost_start_on_the_head_stops_every_node_in_seconds(cluster: Cluster) -> None:
    log = FATAL_STARTUPS / "vllm_0.32.0_cpu_no_cxx_compiler.log"
    started = time.monotonic()
    launched = cluster.launch(FAKE_ENGINE="head-core-dies", FAKE_ENGINE_LOG=str(log))
    seconds = time.monotonic() - started
    assert launched.returncode == 2
    found = FAILURE_LINE.fullmatch(launched.stderr.strip().splitlines()[-1])
    assert found, launched.stderr[-2000:]
    assert found[3].startswith("RuntimeError: Worker failed with error 'InvalidCxxCompiler")
    assert "stopping every node" in launched.stderr
    assert seconds < 40, f"took {seconds:.0f} s of a 60 s ready timeout"
    cluster.assert_nothing_left()


def test_timeout_stops_every_node(cluster: Cluster) -> None:
    launched = cluster.launch("--timeout", "3", FAKE_ENGINE="head-hangs")
    assert launched.returncode == 2
    assert "Error: not ready after 3 s" in launched.stderr
    cluster.assert_nothing_left()


def test_a_failed_start_stops_what_already_runs(cluster: Cluster) -> None:
    # Three nodes: node-b and node-c start before the head; node-c's start fails.
    (cluster.fake.down / "node-c.start").touch()
    launched = cluster.launch(
        "--set",
        "multinode.nodes=3",
        "--set",
        "multinode.tensor_parallel=3",
        # tiny's 4 heads do not split over TP 3 (S10): the start must get as far as the nodes.
        "--force",
        "S10",
        nodes="node-a,node-b,node-c",
    )
    assert launched.returncode == 2
    assert launched.stderr.strip().endswith(
        "Error: node2 (node-c): ssh failed: ssh: connect to host node-c port 22: Connection "
        "refused (hint: check that 'ssh HOST true' works without a password prompt (keys, "
        "known_hosts))"
    )
    assert starts(cluster.fake) == ["node-b", "node-c"]
    cluster.assert_nothing_left()


def test_preflight_failure_starts_nothing(cluster: Cluster) -> None:
    launched = cluster.launch("--set", "multinode.socket_ifname=nope0")
    assert launched.returncode == 2
    assert launched.stderr.strip().endswith(
        "Error: node0 (node-a): no network interface nope0 (hint: --set "
        "multinode.socket_ifname=IFACE names the interface that carries the nodes' addresses "
        "('ip -br addr' lists them))"
    )
    assert starts(cluster.fake) == []
    assert cluster.state() is None


def test_running_deployment_is_not_launched_twice(cluster: Cluster) -> None:
    assert cluster.launch().returncode == 0
    again = cluster.launch()
    assert again.returncode == 2
    assert f"Error: deployment 'tiny' is already running on http://127.0.0.1:{cluster.port}" in (
        again.stderr
    )
    assert len(starts(cluster.fake)) == 2


def test_stop_with_an_unreachable_node_keeps_the_state_to_retry(cluster: Cluster) -> None:
    assert cluster.launch().returncode == 0
    cluster.fake.take_down("node-b")
    failed = cluster.sm120("stop", "--timeout", "5")
    assert failed.returncode == 2
    assert failed.stderr.strip().startswith("Error: node1 (node-b): ssh failed:")
    assert cluster.state() is not None
    record = json.loads((cluster.home / "deployments" / "tiny" / "cluster.json").read_text())
    assert [(p["rank"], p["name"]) for p in record["processes"]] == [(1, "engine")]
    (cluster.fake.down / "node-b").unlink()
    retried = cluster.sm120("stop", "--timeout", "5")
    assert retried.returncode == 0, retried.stderr
    cluster.assert_nothing_left()


def test_worker_dying_is_seen_by_status(cluster: Cluster) -> None:
    assert cluster.launch().returncode == 0
    worker = next(
        pid
        for pid in cluster.engine_processes()
        if b"--headless" in Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    os.kill(worker, 9)
    deadline = time.monotonic() + 15
    status: dict[str, object] = {}
    while time.monotonic() < deadline:
        status = json.loads(cluster.sm120("status", "--json").stdout)[0]
        if not status["running"]:
            break
        time.sleep(0.3)
    assert status["running"] is False
    assert status["exit"] == "killed by SIGKILL"
    assert "[sm120] node1:engine killed by SIGKILL" in cluster.sm120("logs").stdout


def test_ray_layout_starts_head_then_workers_then_serves(cluster: Cluster, tmp_path: Path) -> None:
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir()
    launched = cluster.launch(
        *RAY,
        f"multinode.ray_port={cluster.port}",
        FAKE_RAY_DIR=str(ray_dir),
    )
    assert launched.returncode == 0, launched.stderr
    assert starts(cluster.fake) == ["node-a", "node-b", "node-a"]
    assert f"waiting for 1 nodes in the Ray cluster at 127.0.0.1:{cluster.port}" in launched.stderr
    assert f"waiting for 2 nodes in the Ray cluster at 127.0.0.1:{cluster.port}" in launched.stderr
    assert cluster.sm120("stop").returncode == 0
    cluster.assert_nothing_left()


def test_ray_worker_that_never_joins_fails_the_launch(cluster: Cluster, tmp_path: Path) -> None:
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir()
    launched = cluster.launch(
        *RAY,
        f"multinode.ray_port={cluster.port}",
        "--timeout",
        "6",
        FAKE_RAY_DIR=str(ray_dir),
        FAKE_ENGINE="ray-worker-lost",
    )
    assert launched.returncode == 2
    assert launched.stderr.strip().endswith(
        f"Error: the Ray cluster at 127.0.0.1:{cluster.port} has 1 of 2 nodes after 6 s "
        "(hint: the workers must reach the head's Ray port over the fabric (sm120 logs))"
    )
    assert starts(cluster.fake) == ["node-a", "node-b"]  # the engine never started
    cluster.assert_nothing_left()


class StubHead:
    """Just enough of a Node for wait_for_ray: a head whose Ray daemon may die."""

    label = "node0 (stub)"

    def __init__(self, counts: list[str], running: bool = True) -> None:
        self.counts = counts
        self.running = running
        self.commands: list[list[str]] = []

    def status(self, handle: str) -> object:
        from sm120.engine.cluster.node import ProcessState

        return ProcessState(running=self.running)

    def run(self, handle: str, argv: list[str], timeout: float) -> tuple[int, str]:
        self.commands.append(argv)
        return 0, self.counts.pop(0) if self.counts else "1\n"


def test_wait_for_ray_polls_until_every_node_counts() -> None:
    from sm120.deploy.cluster import RAY_NODES, wait_for_ray

    head = StubHead(["ray noise\n1\n", "2\n"])
    wait_for_ray(head, "h", "/py", "10.0.0.1:6379", 2, timeout=5, poll=0.01)  # type: ignore[arg-type]
    assert head.commands == [["/py", "-c", RAY_NODES, "10.0.0.1:6379"]] * 2


def test_wait_for_ray_fails_when_the_head_dies() -> None:
    from sm120.deploy.cluster import wait_for_ray
    from sm120.deploy.launcher import LaunchError

    with pytest.raises(LaunchError) as caught:
        wait_for_ray(StubHead([], running=False), "h", "/py", "a:1", 2, timeout=5, poll=0.01)  # type: ignore[arg-type]
    assert caught.value.one_line() == (
        "node0 (stub): the Ray head ended before the cluster formed (hint: its output is in the "
        "deployment log (sm120 logs))"
    )
