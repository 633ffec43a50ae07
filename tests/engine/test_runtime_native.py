"""The native runtime against real child processes (small Python scripts written here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sm120.engine.runtime import processes
from sm120.engine.runtime.base import ExitInfo, LaunchSpec
from sm120.engine.runtime.native import NativeRuntime, NativeRuntimeError, owned_group
from sm120.engine.state import DeploymentState, load_state
from tests.fakes.standin import spec_for
from tests.helpers import processes_in_group, wait_for

PRINT_THEN_SLEEP = """
import time
for i in range(3):
    print(f"line {i}", flush=True)
time.sleep(120)
"""

EXIT_THREE = """
print("about to fail", flush=True)
raise SystemExit(3)
"""

IGNORE_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
time.sleep(120)
"""

WITH_GRANDCHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(f"grandchild {child.pid}", flush=True)
time.sleep(120)
"""

SLOW_LINES_THEN_EXIT = """
import time
for i in range(5):
    print(f"tick {i}", flush=True)
    time.sleep(0.05)
print("no newline at the end", end="", flush=True)
"""

PRINT_ENV = """
import os
print("value=" + os.environ["SM120_TEST_VALUE"], flush=True)
print("path-kept=" + str(bool(os.environ.get("PATH"))), flush=True)
"""


@pytest.fixture
def runtime() -> Iterator[NativeRuntime]:
    native = NativeRuntime()
    started: list[DeploymentState] = []
    original_start = native.start

    def start_and_remember(spec: LaunchSpec, log_path: Path) -> DeploymentState:
        state = original_start(spec, log_path)
        started.append(state)
        return state

    native.start = start_and_remember  # type: ignore[method-assign]
    yield native
    for state in started:  # never leave a test's processes behind
        native.stop(state, timeout=2)


def log_lines(state: DeploymentState) -> list[str]:
    path = Path(state.log_path)
    return path.read_text().splitlines() if path.exists() else []


def test_start_logs_output_and_reports_running(runtime: NativeRuntime, tmp_path: Path) -> None:
    state = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "engine.log")
    wait_for(lambda: len(log_lines(state)) == 3)
    assert log_lines(state) == ["line 0", "line 1", "line 2"]
    status = runtime.status(state)
    assert status.running is True
    assert status.exit is None
    assert status.pid == state.engine_pid


def test_start_saves_state_with_both_pids(runtime: NativeRuntime, tmp_path: Path) -> None:
    state = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "engine.log")
    assert load_state("demo") == state
    assert state.runtime == "native"
    assert state.port == 18000
    assert state.engine_pid is not None
    engine_cmdline = Path(f"/proc/{state.engine_pid}/cmdline").read_bytes().split(b"\0")
    assert engine_cmdline[1] == str(tmp_path / "demo_engine.py").encode()
    supervisor_cmdline = Path(f"/proc/{state.supervisor_pid}/cmdline").read_bytes()
    assert b"sm120.engine.runtime.supervise" in supervisor_cmdline


def test_engine_runs_in_its_own_process_group(runtime: NativeRuntime, tmp_path: Path) -> None:
    state = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "engine.log")
    assert state.engine_pid is not None
    assert os.getpgid(state.engine_pid) == state.supervisor_pid
    assert os.getpgid(state.supervisor_pid) != os.getpgrp()


def test_spec_env_is_added_to_the_inherited_environment(
    runtime: NativeRuntime, tmp_path: Path
) -> None:
    spec = spec_for(tmp_path, PRINT_ENV, SM120_TEST_VALUE="from-spec")
    state = runtime.start(spec, tmp_path / "engine.log")
    wait_for(lambda: not runtime.status(state).running)
    assert log_lines(state) == ["value=from-spec", "path-kept=True"]


def test_stop_terminates_the_whole_group_and_records_the_exit(
    runtime: NativeRuntime, tmp_path: Path
) -> None:
    state = runtime.start(spec_for(tmp_path, WITH_GRANDCHILD), tmp_path / "engine.log")
    wait_for(lambda: any(line.startswith("grandchild") for line in log_lines(state)))
    assert len(processes_in_group(state.supervisor_pid)) == 3

    exit_info = runtime.stop(state, timeout=10)

    assert processes_in_group(state.supervisor_pid) == []
    assert exit_info is not None
    assert exit_info.signal == signal.SIGTERM
    assert exit_info.describe() == "killed by SIGTERM"
    assert runtime.status(state).running is False


def test_stop_falls_back_to_sigkill(runtime: NativeRuntime, tmp_path: Path) -> None:
    state = runtime.start(spec_for(tmp_path, IGNORE_SIGTERM), tmp_path / "engine.log")
    wait_for(lambda: log_lines(state) == ["ignoring SIGTERM"])

    began = time.monotonic()
    exit_info = runtime.stop(state, timeout=1.0)
    elapsed = time.monotonic() - began

    assert elapsed >= 1.0
    assert processes_in_group(state.supervisor_pid) == []
    assert exit_info is not None
    assert exit_info.describe() == "killed by SIGKILL"


def test_stop_works_from_the_saved_state_alone(runtime: NativeRuntime, tmp_path: Path) -> None:
    state = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "engine.log")
    wait_for(lambda: len(log_lines(state)) == 3)
    saved = load_state("demo")
    assert saved is not None

    # A different launcher, long after the first one exited, knows only the state file.
    exit_info = NativeRuntime().stop(saved, timeout=10)

    assert exit_info is not None
    assert exit_info.signal == signal.SIGTERM
    assert processes_in_group(state.supervisor_pid) == []


def test_kill_9_of_the_engine_is_reported(runtime: NativeRuntime, tmp_path: Path) -> None:
    state = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "engine.log")
    assert state.engine_pid is not None
    os.kill(state.engine_pid, signal.SIGKILL)

    wait_for(lambda: not runtime.status(state).running)
    status = runtime.status(state)
    assert status.pid is None
    assert status.exit is not None
    assert status.exit.signal == 9
    assert status.exit.returncode is None
    assert status.exit.describe() == "killed by SIGKILL"


def test_exit_code_is_recorded(runtime: NativeRuntime, tmp_path: Path) -> None:
    state = runtime.start(spec_for(tmp_path, EXIT_THREE), tmp_path / "engine.log")
    wait_for(lambda: not runtime.status(state).running)
    exit_info = runtime.exit_info(state)
    assert exit_info is not None
    assert exit_info.returncode == 3
    assert exit_info.signal is None
    assert exit_info.describe() == "exited with code 3"
    assert exit_info.ended_at >= state.started_at
    assert log_lines(state) == ["about to fail"]


def test_sigterm_to_the_supervisor_alone_reaches_the_engine(
    runtime: NativeRuntime, tmp_path: Path
) -> None:
    state = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "engine.log")
    wait_for(lambda: len(log_lines(state)) == 3)
    os.kill(state.supervisor_pid, signal.SIGTERM)
    wait_for(lambda: not runtime.status(state).running)
    exit_info = runtime.exit_info(state)
    assert exit_info is not None
    assert exit_info.signal == signal.SIGTERM


def test_missing_executable_is_recorded_as_exit_127(runtime: NativeRuntime, tmp_path: Path) -> None:
    spec = spec_for(tmp_path, "")
    spec = LaunchSpec(**{**spec.__dict__, "argv": (str(tmp_path / "no-such-engine"),)})
    state = runtime.start(spec, tmp_path / "engine.log")
    wait_for(lambda: not runtime.status(state).running)
    exit_info = runtime.exit_info(state)
    assert exit_info is not None
    assert exit_info.returncode == 127
    assert "cannot start" in Path(state.log_path).read_text()


def test_refuses_to_start_a_running_deployment_twice(
    runtime: NativeRuntime, tmp_path: Path
) -> None:
    spec = spec_for(tmp_path, PRINT_THEN_SLEEP)
    first = runtime.start(spec, tmp_path / "engine.log")
    with pytest.raises(NativeRuntimeError) as caught:
        runtime.start(spec, tmp_path / "engine.log")
    assert caught.value.message == (
        f"deployment demo is already running (process group {first.supervisor_pid})"
    )
    assert caught.value.hint == "stop it first: sm120 stop demo"


def test_restart_after_exit_clears_the_previous_exit_record(
    runtime: NativeRuntime, tmp_path: Path
) -> None:
    first = runtime.start(spec_for(tmp_path, EXIT_THREE), tmp_path / "engine.log")
    wait_for(lambda: not runtime.status(first).running)
    second = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "engine.log")
    assert runtime.status(second).running is True
    assert runtime.exit_info(second) is None


def test_follow_yields_lines_until_the_engine_exits(runtime: NativeRuntime, tmp_path: Path) -> None:
    state = runtime.start(spec_for(tmp_path, SLOW_LINES_THEN_EXIT), tmp_path / "engine.log")
    lines = list(runtime.follow(state))
    assert lines == [f"tick {i}" for i in range(5)] + ["no newline at the end"]


def test_follow_skips_lines_before_from_line(runtime: NativeRuntime, tmp_path: Path) -> None:
    state = runtime.start(spec_for(tmp_path, SLOW_LINES_THEN_EXIT), tmp_path / "engine.log")
    lines = list(runtime.follow(state, from_line=3))
    assert lines == ["tick 3", "tick 4", "no newline at the end"]


def test_follow_stops_when_asked_while_the_engine_runs(
    runtime: NativeRuntime, tmp_path: Path
) -> None:
    state = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "engine.log")
    received: list[str] = []
    for line in runtime.follow(state, stop=lambda: len(received) >= 2):
        received.append(line)
    assert received == ["line 0", "line 1"]
    assert runtime.status(state).running is True


def test_exit_info_is_none_while_running(runtime: NativeRuntime, tmp_path: Path) -> None:
    state = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "engine.log")
    assert runtime.exit_info(state) is None


def test_supervisor_exit_file_format_matches_exit_info(tmp_path: Path) -> None:
    exit_file = tmp_path / "exit.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "sm120.engine.runtime.supervise",
            "--exit-file",
            str(exit_file),
            "--",
            sys.executable,
            "-c",
            "raise SystemExit(5)",
        ],
        check=False,
    )
    assert completed.returncode == 5
    assert set(json.loads(exit_file.read_text())) == {"returncode", "signal", "ended_at"}
    exit_info = ExitInfo.read(exit_file)
    assert exit_info is not None
    assert (exit_info.returncode, exit_info.signal) == (5, None)


def test_supervisor_rejects_a_malformed_command_line(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "sm120.engine.runtime.supervise", "echo", "hi"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 1
    assert (
        "usage: python -m sm120.engine.runtime.supervise --exit-file FILE [--log LOG] "
        "[--ward-command JSON] -- ARGV..." in completed.stderr
    )


@pytest.mark.parametrize(
    ("exit_info", "text"),
    [
        (ExitInfo(returncode=0, signal=None, ended_at=0.0), "exited with code 0"),
        (ExitInfo(returncode=None, signal=9, ended_at=0.0), "killed by SIGKILL"),
        (ExitInfo(returncode=None, signal=200, ended_at=0.0), "killed by signal 200"),
        (ExitInfo(returncode=None, signal=None, ended_at=0.0), "ended (exit status unknown)"),
    ],
)
def test_exit_info_describe(exit_info: ExitInfo, text: str) -> None:
    assert exit_info.describe() == text


# --- is it running: one /proc read while the supervisor or the engine lives ----------------


def _no_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything scans every process (what a launch's wait and the monitor
    must not do many times a second while the supervisor or the engine still runs)."""

    def scanned(pgid: int) -> list[int]:
        raise AssertionError(f"scanned /proc for process group {pgid}")

    monkeypatch.setattr(processes, "group_members", scanned)


def test_running_is_read_from_the_supervisor_without_a_process_scan(
    runtime: NativeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "e.log")
    with monkeypatch.context() as patched:
        _no_scan(patched)
        status = runtime.status(state)
    assert status.running and status.pid == state.engine_pid


def test_an_engine_that_outlived_its_supervisor_still_runs_without_a_scan(
    runtime: NativeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = runtime.start(spec_for(tmp_path, PRINT_THEN_SLEEP), tmp_path / "e.log")
    # The engine writes through the supervisor's pipe: a line written after the supervisor
    # is gone breaks that pipe and ends the engine, so only kill it once the lines are out.
    wait_for(lambda: len(log_lines(state)) == 3)
    os.kill(state.supervisor_pid, signal.SIGKILL)
    wait_for(lambda: not processes.RecordedProcess(state.supervisor_pid, state.supervisor_start)
             .is_running())  # fmt: skip
    with monkeypatch.context() as patched:
        _no_scan(patched)
        assert runtime.status(state).running
    runtime.stop(state, timeout=5)
    assert processes_in_group(state.supervisor_pid) == []


def test_what_is_left_in_the_group_after_both_ended_is_found_by_the_scan(
    runtime: NativeRuntime, tmp_path: Path
) -> None:
    state = runtime.start(spec_for(tmp_path, WITH_GRANDCHILD), tmp_path / "e.log")
    wait_for(lambda: len(processes_in_group(state.supervisor_pid)) == 3)
    # Neither the supervisor nor the engine records anything: both are killed outright.
    assert state.engine_pid is not None
    os.kill(state.engine_pid, signal.SIGKILL)
    os.kill(state.supervisor_pid, signal.SIGKILL)
    wait_for(lambda: len(processes_in_group(state.supervisor_pid)) == 1)
    group = owned_group(state)
    assert group.has_live_member() and group.members() == processes_in_group(state.supervisor_pid)
    runtime.stop(state, timeout=5)
    assert not owned_group(state).has_live_member()


def test_a_stranger_with_the_recorded_numbers_is_not_a_live_member(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        wait_for(lambda: processes.start_ticks(stranger.pid) is not None)
        wrong_start = (processes.start_ticks(stranger.pid) or 0) + 1
        group = processes.OwnedGroup(
            leader=processes.RecordedProcess(stranger.pid, wrong_start),
            engine=processes.RecordedProcess(stranger.pid, wrong_start),
        )
        assert not group.has_live_member()
    finally:
        stranger.kill()
        stranger.wait()
