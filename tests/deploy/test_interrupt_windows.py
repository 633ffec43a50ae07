"""Ctrl-C (SIGINT) early in a launch, sent for real to real processes: during preflight, while
a provisioning command runs, in the moment between the engine's spawn and its state file, and
right after the engine started. Each ends with nothing left running and no state written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sm120.engine import engine_env
from sm120.engine import state as state_module
from sm120.engine.runtime import native
from sm120.engine.runtime.native import NativeRuntime
from sm120.engine.state import load_state
from tests.fakes.standin import VLLM_LOGS, make_engine_python, make_model_dir, spec_for
from tests.helpers import free_port, port_is_free, processes_in_group, wait_for
from tests.integration.realstack import engine_processes, state_of

WITH_GRANDCHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print(f"grandchild {child.pid}", flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_sigint_between_the_spawn_and_the_state_file_stops_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_home: Path
) -> None:
    spawned: list[int] = []
    spawn, save = native._spawn_supervisor, state_module.save_state

    def remember(*args: object) -> subprocess.Popen[bytes]:
        supervisor = spawn(*args)  # type: ignore[arg-type]
        spawned.append(supervisor.pid)
        return supervisor

    def interrupted_save(state: object) -> Path:
        # The engine runs (and has started its own child): Ctrl-C lands now, for real.
        wait_for(lambda: len(processes_in_group(spawned[0])) >= 3, timeout=30)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises KeyboardInterrupt here
        return save(state)  # type: ignore[arg-type]

    monkeypatch.setattr(native, "_spawn_supervisor", remember)
    monkeypatch.setattr(native, "save_state", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        NativeRuntime().start(spec_for(tmp_path, WITH_GRANDCHILD), tmp_path / "engine.log")
    assert processes_in_group(spawned[0]) == []
    assert load_state("demo") is None


def test_sigint_while_a_provisioning_command_runs_ends_the_command(tmp_path: Path) -> None:
    script = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(300)\n"
    seen: list[int] = []

    def progress(line: str) -> None:
        seen.append(int(line))
        # The launcher alone is signalled (a SIGTERM it turns into KeyboardInterrupt, or a
        # Ctrl-C the command ignores): the command must not run on.
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        engine_env.stream_command([sys.executable, "-c", script], progress)
    assert time.monotonic() - started < 10
    assert not _alive(seen[0])


# --- the whole launch, as the user runs it ------------------------------------------------

SLOW_PROBE_PYTHON = """#!/bin/bash
# An engine Python whose preflight probe (python -c) hangs: Ctrl-C lands during preflight.
case "$1" in
  -c|-I) exec {python} -c "import os, time; open('{marker}', 'w').write(str(os.getpid())); \\
time.sleep(300)";;
esac
exec {python} -c "import time; time.sleep(300)"
"""


def _launch(home: Path, python: Path, model: Path, port: int) -> subprocess.Popen[str]:
    env = {**os.environ, "SM120_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("VLLM_PYTHON", None)
    argv = [
        sys.executable, "-m", "sm120", "launch", "tiny", "--vllm-python", str(python),
        "--model-dir", str(model), "--port", str(port), "--no-monitor", "--timeout", "120",
    ]  # fmt: skip
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _interrupt(launcher: subprocess.Popen[str]) -> tuple[int, str]:
    launcher.send_signal(signal.SIGINT)  # the launcher alone, not its process group
    _, err = launcher.communicate(timeout=90)
    return launcher.returncode, err


def test_sigint_during_preflight_leaves_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "probe.pid"
    python = tmp_path / "engine-python"
    python.write_text(SLOW_PROBE_PYTHON.format(python=sys.executable, marker=marker))
    python.chmod(0o755)
    home, port = tmp_path / "home", free_port()
    launcher = _launch(home, python, make_model_dir(tmp_path), port)
    wait_for(lambda: marker.is_file() and marker.read_text() != "", timeout=60)
    code, err = _interrupt(launcher)
    assert code == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        "interrupted: the engine was stopped and nothing is left running"
    )
    assert not _alive(int(marker.read_text()))
    assert state_of(home) is None
    assert not (home / "deployments" / "tiny" / "state.json").exists()


def test_sigint_right_after_the_engine_started_stops_it(tmp_path: Path) -> None:
    # The stand-in prints a real start-up's first lines, then hangs: never READY.
    log = VLLM_LOGS / "v0.11_cpu_kv_too_small.log"
    lines = log.read_text().splitlines()[:5]
    start = tmp_path / "start.log"
    start.write_text("\n".join(lines) + "\n")
    python = make_engine_python(tmp_path, start)
    home, port = tmp_path / "home", free_port()
    launcher = _launch(home, python, make_model_dir(tmp_path), port)
    state_file = home / "deployments" / "tiny" / "state.json"
    wait_for(state_file.is_file, timeout=60)
    engine = state_of(home)
    assert engine is not None and engine_processes(port)
    code, err = _interrupt(launcher)
    assert code == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        "interrupted: the engine was stopped and nothing is left running"
    )
    assert processes_in_group(engine["supervisor_pid"]) == []
    assert engine_processes(port) == []
    assert port_is_free(port)
    assert not state_file.exists()


def test_sigint_while_the_monitor_starts_stops_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_home: Path
) -> None:
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from sm120.cli.app import app
    from sm120.deploy import launcher

    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    python = make_engine_python(tmp_path, VLLM_LOGS / "v0.11_cpu_kv_too_small.log", delay=5)
    port = free_port()
    started: list[dict[str, object]] = []

    def ready_at_once(*_args: object, **_kwargs: object) -> object:
        # The engine runs (a stand-in that never serves): take it as READY, as a real
        # engine's smoke test would, so the launch goes on to start its monitor.
        engine = state_of(isolated_home)
        assert engine is not None
        started.append(engine)
        return SimpleNamespace(monitor_pid=None, steps=[], total_s=0.0)

    def interrupted_monitor(_name: str) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        raise AssertionError("the interrupt did not land")

    monkeypatch.setattr(launcher, "wait_and_smoke", ready_at_once)
    monkeypatch.setattr(launcher, "start_for", interrupted_monitor)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(
            app,
            ["launch", "tiny", "--vllm-python", str(python), "--model-dir",
             str(make_model_dir(tmp_path)), "--port", str(port)],
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 130, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "interrupted: the engine was stopped and nothing is left running"
    )
    supervisor = started[0]["supervisor_pid"]
    assert isinstance(supervisor, int)
    assert processes_in_group(supervisor) == []
    assert engine_processes(port) == []
    assert state_of(isolated_home) is None


def test_sigint_between_a_containers_start_and_its_state_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_home: Path
) -> None:
    from dataclasses import replace
    from types import SimpleNamespace

    from sm120.engine import docker_api
    from sm120.engine.runtime import docker

    removed: list[bool] = []
    container = SimpleNamespace(id="c0ffee", remove=lambda force: removed.append(force))
    monkeypatch.setattr(docker_api, "run_container", lambda _client, _run: container)
    monkeypatch.setattr(docker_api, "containers_labelled", lambda _client, _labels: [])

    def interrupted_capture(*_args: object) -> object:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        raise AssertionError("the interrupt did not land")

    monkeypatch.setattr(docker, "_spawn_capture", interrupted_capture)
    spec = replace(spec_for(tmp_path, "pass"), container={"image": "x"})
    with pytest.raises(KeyboardInterrupt):
        docker.DockerRuntime(client=object()).start(spec, tmp_path / "engine.log")
    assert removed == [True]
    assert load_state("demo") is None
