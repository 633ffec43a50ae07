"""`sm120 launch tiny --foreground` against the real vLLM (CPU build), as a systemd unit runs
it: READY=1 on $NOTIFY_SOCKET, SIGTERM stops everything and exits 0, and an engine killed
under it ends it non-zero (so Restart=on-failure brings it back)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.integration.realstack import assert_nothing_left, cli_env, engine_processes, state_of

pytestmark = pytest.mark.integration


def assert_gone(pid: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), f"process {pid} is still there"


class Foreground:
    def __init__(self, tmp_path: Path, tiny_model: Path) -> None:
        self.home, self.port = tmp_path / "home", free_port()
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(tmp_path / "notify.sock"))
        self.err_path = tmp_path / "stderr.log"
        env = {**cli_env(self.home), "NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
        command = [sys.executable, "-m", "sm120", "launch", "tiny", "--port", str(self.port)]
        command += ["--model-dir", str(tiny_model), "--foreground"]
        # stderr carries the engine's whole log: a file, so no pipe fills and stalls it.
        with self.err_path.open("w") as err:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )

    def wait_ready(self) -> float:
        started = time.monotonic()
        self.notify.settimeout(900)
        message = self.notify.recv(200).decode()
        assert message.startswith("READY=1\n"), message
        assert f"MAINPID={self.process.pid}" in message
        assert self.process.poll() is None
        return time.monotonic() - started

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        out, _ = self.process.communicate(timeout=timeout)
        return self.process.returncode, out, self.err_path.read_text()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.notify.close()


@pytest.fixture
def foreground(tmp_path: Path, tiny_model: Path) -> Iterator[Foreground]:
    served = Foreground(tmp_path, tiny_model)
    try:
        yield served
    finally:
        served.close()
        if state_of(served.home) is not None:
            subprocess.run(
                [sys.executable, "-m", "sm120", "stop", "tiny"],
                env=cli_env(served.home),
                check=False,
            )


def test_sigterm_stops_the_deployment_and_exits_0(foreground: Foreground) -> None:
    seconds = foreground.wait_ready()
    state = state_of(foreground.home)
    assert state is not None and engine_processes(foreground.port)
    foreground.process.send_signal(signal.SIGTERM)
    code, out, err = foreground.finish()
    assert code == 0, err[-3000:]
    assert "READY tiny answered:" in out
    assert "stopping...\nstopped tiny: the engine " in err
    assert_nothing_left(foreground.home, foreground.port, state["supervisor_pid"])
    monitor = re.search(r"monitor   sm120 monitor \(pid (\d+);", out)
    assert monitor, out
    assert_gone(int(monitor[1]))
    print(f"READY after {seconds:.0f} s")


def test_an_engine_killed_under_it_ends_it_non_zero(foreground: Foreground) -> None:
    foreground.wait_ready()
    state = state_of(foreground.home)
    assert state is not None and state["engine_pid"]
    os.kill(state["engine_pid"], signal.SIGKILL)
    code, _, err = foreground.finish()
    assert code == 1, err[-3000:]
    assert "\nthe engine killed by SIGKILL\ncleaned up (it had already ended) tiny: " in err
    # The launcher cleaned up after the dead engine: a restart starts from nothing.
    assert_nothing_left(foreground.home, foreground.port, state["supervisor_pid"])
