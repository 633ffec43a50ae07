"""A warded engine under the native runtime: the supervisor starts the ward first, the engine
listens on its unix socket only, and `stop` leaves no ward, no socket and a free port."""

from __future__ import annotations

import dataclasses
import json
import socket
import sys
from pathlib import Path

import httpx
import pytest

from sm120.engine.runtime.native import NativeRuntime
from sm120.engine.runtime.processes import start_ticks
from sm120.engine.state import engine_socket_path, load_state
from tests.fakes.standin import spec_for
from tests.helpers import free_port, port_is_free, processes_in_group, wait_for

# An engine that serves /health and /invocations on the socket its --uds names, like vLLM.
UDS_ENGINE = """
import json, socketserver, sys
from http.server import BaseHTTPRequestHandler
path = sys.argv[sys.argv.index("--uds") + 1]
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def _answer(self):
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _answer
    def address_string(self):
        return "unix"
    def log_message(self, *args):
        pass
class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
print("serving on", path, flush=True)
Server(path, Handler).serve_forever()
"""


@pytest.fixture
def runtime() -> NativeRuntime:
    return NativeRuntime()


def warded_spec(tmp_path: Path, port: int, key: str | None = "sk-warded-test-key"):  # type: ignore[no-untyped-def]
    spec = spec_for(tmp_path, UDS_ENGINE, name="warded")
    socket_path = str(engine_socket_path("warded"))
    key_file = None
    if key is not None:
        key_file = tmp_path / "api_key"
        key_file.write_text(key)
        key_file.chmod(0o600)
    return dataclasses.replace(
        spec,
        argv=(*spec.argv, "--uds", socket_path),
        port=port,
        engine_socket=socket_path,
        api_key_file=str(key_file) if key_file else None,
    )


def test_the_port_is_the_wards_and_the_engine_has_only_its_socket(
    runtime: NativeRuntime, tmp_path: Path
) -> None:
    port = free_port()
    spec = warded_spec(tmp_path, port)
    state = runtime.start(spec, tmp_path / "logs" / "serve.log")
    try:
        assert state.engine_socket == spec.engine_socket
        saved = load_state("warded")
        assert saved is not None and saved.engine_socket == spec.engine_socket
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _status(url + "/health") == 200, timeout=30)
        # the recorded engine is the engine, not the ward the supervisor started first
        assert state.engine_pid is not None
        cmdline = Path(f"/proc/{state.engine_pid}/cmdline").read_bytes()
        assert b"warded_engine.py" in cmdline and b"sm120.engine.ward" not in cmdline
        assert state.engine_start == start_ticks(state.engine_pid)
        # what vLLM leaves unguarded answers nobody on the port
        assert _status(url + "/invocations", method="POST") == 404
        assert _status(url + "/v1/models") == 401
        ok = httpx.get(url + "/v1/models", headers={"x-api-key": "sk-warded-test-key"})
        assert ok.json() == {"path": "/v1/models"}
        folder = Path(spec.engine_socket or "").parent
        assert folder.stat().st_mode & 0o777 == 0o700
        # the engine runs under umask 077: its socket (and what else it makes) is ours alone
        assert Path(spec.engine_socket or "").stat().st_mode & 0o077 == 0
    finally:
        runtime.stop(state, timeout=5)
    assert processes_in_group(state.supervisor_pid) == []
    assert not Path(spec.engine_socket or "").exists()
    assert not Path(spec.engine_socket or "").parent.exists()  # its folder goes with it
    assert port_is_free(port)


def test_a_port_the_ward_cannot_take_stops_the_launch_before_the_engine(
    runtime: NativeRuntime, tmp_path: Path
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        spec = warded_spec(tmp_path, holder.getsockname()[1])
        state = runtime.start(spec, tmp_path / "logs" / "serve.log")
        wait_for(lambda: runtime.status(state).exit is not None, timeout=40)
    exit_info = runtime.status(state).exit
    assert exit_info is not None and exit_info.returncode == 127
    log = Path(state.log_path).read_text()
    assert "cannot listen on" in log and "the engine was not started" in log
    assert "serving on" not in log  # the engine never ran


def test_a_ward_that_dies_is_started_again(runtime: NativeRuntime, tmp_path: Path) -> None:
    port = free_port()
    state = runtime.start(warded_spec(tmp_path, port), tmp_path / "logs" / "serve.log")
    try:
        url = f"http://127.0.0.1:{port}/health"
        wait_for(lambda: _status(url) == 200, timeout=30)
        ward_pid = _ward_pid(state.supervisor_pid)
        import os
        import signal

        os.kill(ward_pid, signal.SIGKILL)
        wait_for(lambda: _ward_pid(state.supervisor_pid, not_=ward_pid) > 0, timeout=30)
        wait_for(lambda: _status(url) == 200, timeout=30)
        assert "the ward ended (-9); starting it again" in Path(state.log_path).read_text()
    finally:
        runtime.stop(state, timeout=5)


def test_the_supervisor_refuses_a_malformed_ward_command(tmp_path: Path) -> None:
    import subprocess

    argv = [sys.executable, "-m", "sm120.engine.runtime.supervise", "--exit-file",
            str(tmp_path / "exit.json"), "--ward-command", json.dumps({"not": "a list"}),
            "--", sys.executable, "-c", "pass"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode != 0 and "usage:" in done.stderr
    assert not (tmp_path / "exit.json").exists()


def _status(url: str, method: str = "GET") -> int:
    try:
        return httpx.request(method, url, timeout=5).status_code
    except httpx.HTTPError:
        return 0


def _ward_pid(supervisor: int, not_: int = 0) -> int:
    for pid in processes_in_group(supervisor):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"\0-m\0sm120.engine.ward\0" in command and pid != not_:
            return pid
    return 0


def test_a_warded_spec_starts_again_after_a_stop(runtime: NativeRuntime, tmp_path: Path) -> None:
    """`stop` removes the socket's folder; the monitor's relaunch starts the saved spec again,
    which makes it anew (a ward that found no folder would end the relaunch)."""
    port = free_port()
    spec = warded_spec(tmp_path, port)
    for _ in range(2):
        state = runtime.start(spec, tmp_path / "logs" / "serve.log")
        try:
            wait_for(lambda: _status(f"http://127.0.0.1:{port}/health") == 200, timeout=30)
        finally:
            runtime.stop(state, timeout=5)
        assert not Path(spec.engine_socket or "").parent.exists()
