"""`stop` and `status` never act on a process sm120 did not start, whatever the state says.

Real processes throughout: an unrelated `sleep` stands in for the program that was given a
recorded pid after the deployment's own process ended.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sm120.engine.runtime.native import NativeRuntime
from sm120.engine.runtime.processes import start_ticks
from sm120.engine.state import deployment_dir, deployment_lock, load_state
from tests.fakes.standin import spec_for
from tests.helpers import invoke, processes_in_group, wait_for

ORPHAN_LEFT_BEHIND = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(f"grandchild {child.pid}", flush=True)
"""


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated program leading its own session, as the supervisor does."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    wait_for(lambda: start_ticks(process.pid) is not None)
    yield process
    process.kill()
    process.wait()


def state_document(folder: Path, **changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "name": "demo",
        "recipe": "tiny",
        "runtime": "native",
        "supervisor_pid": 4_194_304,
        "supervisor_start": None,
        "engine_pid": None,
        "engine_start": None,
        "host": "127.0.0.1",
        "port": 18000,
        "plan_hash": "h",
        "started_at": 1700000000.0,
        "log_path": str(folder / "logs" / "serve.log"),
        "exit_file": str(folder / "exit.json"),
        "served_model_name": "tiny",
        "model_dir": None,
        "api_key_file": None,
        "container_id": None,
    }
    document.update(changes)
    return document


def write_state(text_or_document: Any) -> Path:
    folder = deployment_dir("demo")
    path = folder / "state.json"
    if isinstance(text_or_document, str):
        path.write_text(text_or_document)
    else:
        path.write_text(json.dumps(text_or_document))
    return path


def stale_message(pid: int) -> str:
    return (
        f"cleaned up demo: process {pid} named in its state is gone or is not one sm120 "
        "started, so nothing was signalled\n"
    )


def test_stop_leaves_a_stranger_with_the_recorded_pid_alone(
    cli: CliRunner, stranger: subprocess.Popen[bytes]
) -> None:
    ticks = start_ticks(stranger.pid)
    assert ticks is not None
    # The deployment's supervisor had this pid once, but started at another time.
    write_state(state_document(deployment_dir("demo"), supervisor_pid=stranger.pid,
                               supervisor_start=ticks - 1))  # fmt: skip

    assert invoke(cli, "stop", "demo") == (0, stale_message(stranger.pid), "")
    time.sleep(0.2)
    assert stranger.poll() is None, "stop signalled a process sm120 never started"
    assert load_state("demo") is None


def test_a_forged_exit_record_does_not_make_a_stranger_ours(
    cli: CliRunner, stranger: subprocess.Popen[bytes]
) -> None:
    # An exit record "ended later than the stranger started" once let the stranger pass as a
    # process left in the supervisor's group: the live process under the group's number
    # proves the group gone, whatever the file says.
    ticks = start_ticks(stranger.pid)
    assert ticks is not None
    folder = deployment_dir("demo")
    write_state(state_document(folder, supervisor_pid=stranger.pid, supervisor_start=ticks - 1))
    forged = {"returncode": 0, "signal": None, "ended_at": time.time() + 3600}
    (folder / "exit.json").write_text(json.dumps(forged))

    code, out, _ = invoke(cli, "stop", "demo")
    time.sleep(0.2)
    assert (code, out.startswith("cleaned up")) == (0, True)
    assert stranger.poll() is None, "a forged exit record made stop signal a stranger"


def test_stop_leaves_a_stranger_alone_when_the_state_predates_start_times(
    cli: CliRunner, stranger: subprocess.Popen[bytes]
) -> None:
    # Older state files hold only the pid: the process's command line must name the
    # supervisor and this deployment's exit file, and `sleep 300` does not.
    write_state(state_document(deployment_dir("demo"), supervisor_pid=stranger.pid))

    assert invoke(cli, "stop", "--name", "demo") == (0, stale_message(stranger.pid), "")
    time.sleep(0.2)
    assert stranger.poll() is None


def test_stop_leaves_a_stranger_alone_when_the_engine_pid_was_reused(
    cli: CliRunner, stranger: subprocess.Popen[bytes]
) -> None:
    ticks = start_ticks(stranger.pid)
    assert ticks is not None
    write_state(state_document(deployment_dir("demo"), supervisor_pid=stranger.pid,
                               supervisor_start=ticks + 5, engine_pid=stranger.pid,
                               engine_start=ticks + 5))  # fmt: skip

    code, out, _ = invoke(cli, "stop", "demo")
    time.sleep(0.2)
    assert (code, out) == (0, stale_message(stranger.pid))
    assert stranger.poll() is None


def test_status_does_not_call_a_stranger_running(
    cli: CliRunner, stranger: subprocess.Popen[bytes]
) -> None:
    write_state(state_document(deployment_dir("demo"), supervisor_pid=stranger.pid,
                               supervisor_start=0))  # fmt: skip

    code, out, err = invoke(cli, "status", "demo")
    assert (code, err) == (0, "")
    assert out.splitlines()[1] == (
        f"  gone      no end was recorded and process {stranger.pid} is not one sm120 started "
        "(stale state: 'sm120 stop demo' clears it)"
    )
    code, out, _ = invoke(cli, "status", "--json")
    row = json.loads(out)[0]
    assert (row["running"], row["stale"], row["pid"]) == (False, True, None)
    assert stranger.poll() is None


PID_RANGE = "a process id from 2 to 4194304"
BAD_FIELDS = [
    ("supervisor_pid", 1, f"'supervisor_pid' must be {PID_RANGE}, not 1"),
    ("supervisor_pid", 0, f"'supervisor_pid' must be {PID_RANGE}, not 0"),
    ("supervisor_pid", -7, f"'supervisor_pid' must be {PID_RANGE}, not -7"),
    ("supervisor_pid", "123", f"'supervisor_pid' must be {PID_RANGE}, not \"123\""),
    ("supervisor_pid", True, f"'supervisor_pid' must be {PID_RANGE}, not true"),
    ("supervisor_pid", 12.5, f"'supervisor_pid' must be {PID_RANGE}, not 12.5"),
    ("supervisor_pid", 10**30, f"'supervisor_pid' must be {PID_RANGE}, not "
                               "1000000000000000000000000000000"),
    ("engine_pid", 1, "'engine_pid' must be null or a process id from 2 to 4194304, not 1"),
    ("supervisor_start", -1, "'supervisor_start' must be null or clock ticks, not -1"),
    ("port", 0, "'port' must be a port from 1 to 65535, not 0"),
    ("port", "8000", "'port' must be a port from 1 to 65535, not \"8000\""),
    ("started_at", "today", "'started_at' must be a time in seconds since 1970, not \"today\""),
    ("exit_file", ["a"], "'exit_file' must be a file path, not [\"a\"]"),
    ("host", None, "'host' must be a host name or address, not null"),
    ("host", "a b", "'host' must be a host name or address, not \"a b\""),
    ("started_at", float("nan"), "'started_at' must be a time in seconds since 1970, not NaN"),
    ("started_at", 10**400, "'started_at' must be a time in seconds since 1970, not "
                            f"{'1' + '0' * 36}..."),
    ("name", "other", "it names deployment 'other'"),
    ("name", "../x", "'name' must be a deployment name, not \"../x\""),
    ("model_dir", 5, "'model_dir' must be null or a folder path, not 5"),
    ("recipe", {"a": 1}, "'recipe' must be a recipe name, not {\"a\": 1}"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value", "problem"), BAD_FIELDS)
@pytest.mark.parametrize("command", ["stop", "status"])
def test_a_wrong_field_is_one_line_and_signals_nothing(
    cli: CliRunner, command: str, field: str, value: Any, problem: str
) -> None:
    path = write_state(state_document(deployment_dir("demo"), **{field: value}))
    expected = (
        f"Error: deployment state file {path} is unusable: {problem} "
        f"(hint: delete {path} if that deployment is no longer running)\n"
    )
    assert invoke(cli, command, "demo") == (2, "", expected)
    assert path.exists(), "a state file we cannot read is the user's to delete"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "is not JSON (Expecting property name enclosed in double quotes, line 1)"),
        ("[1, 2]", "is unusable: it holds list, not a JSON object"),
        ("null", "is unusable: it holds NoneType, not a JSON object"),
        ('{"name": "demo"}', "is unusable: 'recipe' is missing"),
    ],
)
def test_a_broken_state_file_is_one_line(cli: CliRunner, text: str, problem: str) -> None:
    path = write_state(text)
    code, out, err = invoke(cli, "stop", "demo")
    assert (code, out) == (2, "")
    assert err.startswith(f"Error: deployment state file {path} {problem}")
    assert err.endswith(f"(hint: delete {path} if that deployment is no longer running)\n")
    assert len(err.splitlines()) == 1


def test_a_binary_state_file_is_one_line(cli: CliRunner) -> None:
    path = deployment_dir("demo") / "state.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    code, out, err = invoke(cli, "stop", "demo")
    assert (code, out) == (2, "")
    assert err.startswith(f"Error: deployment state file {path} is unusable: 'utf-8' codec")
    assert len(err.splitlines()) == 1


def test_stop_takes_the_name_once(cli: CliRunner) -> None:
    assert invoke(cli, "stop", "demo", "--name", "other") == (
        2,
        "",
        "Error: two deployments named: 'demo' and --name 'other' (hint: give one of them)\n",
    )


# --- what is ours is still stopped ---------------------------------------------------------


def test_stop_ends_our_own_deployment_from_a_state_file_without_start_times(
    cli: CliRunner, tmp_path: Path
) -> None:
    state = NativeRuntime().start(spec_for(tmp_path, "import time; time.sleep(120)"),
                                  tmp_path / "engine.log")  # fmt: skip
    path = deployment_dir("demo") / "state.json"
    document = json.loads(path.read_text())
    # As sm120 wrote it before start times were recorded.
    del document["supervisor_start"], document["engine_start"]
    path.write_text(json.dumps(document))

    code, out, _ = invoke(cli, "stop", "demo")
    assert code == 0
    assert out.startswith("stopped demo: the engine killed by SIGTERM after ")
    assert processes_in_group(state.supervisor_pid) == []


def test_stop_ends_what_an_exited_engine_left_in_its_group(cli: CliRunner, tmp_path: Path) -> None:
    state = NativeRuntime().start(spec_for(tmp_path, ORPHAN_LEFT_BEHIND), tmp_path / "e.log")
    runtime = NativeRuntime()
    # The engine and its supervisor end; the grandchild lives on in their group.
    wait_for(lambda: runtime.exit_info(state) is not None, timeout=20)
    wait_for(lambda: len(processes_in_group(state.supervisor_pid)) == 1)

    code, out, _ = invoke(cli, "stop", "demo")
    assert code == 0
    assert out.startswith("cleaned up (it had already ended) demo: the engine exited with code 0")
    wait_for(lambda: processes_in_group(state.supervisor_pid) == [])


# --- one launch or stop at a time ----------------------------------------------------------

HOLD_LOCK = """
import sys, time
from sm120.engine.state import deployment_lock
with deployment_lock("demo", "launch"):
    print("holding", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def lock_holder(isolated_home: Path) -> Iterator[subprocess.Popen[str]]:
    """Another sm120 process in the middle of launching `demo`."""
    process = subprocess.Popen([sys.executable, "-c", HOLD_LOCK], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline() == "holding\n"
    yield process
    process.kill()
    process.wait()


def busy(doing: str, pid: int) -> str:
    return (
        f"Error: cannot {doing} deployment 'demo': another sm120 (pid {pid}) is launching or "
        "stopping it right now (hint: wait for that to finish, then see 'sm120 status')\n"
    )


def test_stop_waits_its_turn(cli: CliRunner, lock_holder: subprocess.Popen[str]) -> None:
    path = write_state(state_document(deployment_dir("demo")))
    assert invoke(cli, "stop", "demo") == (2, "", busy("stop", lock_holder.pid))
    assert path.exists()


def test_a_second_launch_is_refused_before_it_writes_anything(
    cli: CliRunner, lock_holder: subprocess.Popen[str]
) -> None:
    folder = deployment_dir("demo")
    (folder / "logs").mkdir(mode=0o700)
    (folder / "logs" / "serve.log").write_text("the first launch's log\n")
    (folder / "plan.json").write_text('{"plan_hash": "first"}\n')
    before = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    code, out, err = invoke(cli, "launch", "tiny", "--name", "demo", "--gpus", "0", "--arch",
                            "cpu", "--no-monitor")  # fmt: skip

    assert (code, out) == (2, "")
    assert err.endswith(busy("launch", lock_holder.pid))
    assert {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_the_engine_does_not_inherit_the_launch_lock(cli: CliRunner, tmp_path: Path) -> None:
    from sm120.core.pidlock import lock_holder

    with deployment_lock("demo", "launch"):
        state = NativeRuntime().start(spec_for(tmp_path, "import time; time.sleep(120)"),
                                      tmp_path / "engine.log")  # fmt: skip
    # Were the lock passed on to the supervisor, no stop could run while the engine does.
    assert lock_holder(deployment_dir("demo") / "lock") is None
    code, out, _ = invoke(cli, "stop", "demo")
    assert code == 0 and out.startswith("stopped demo: the engine killed by SIGTERM")
    assert processes_in_group(state.supervisor_pid) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"returncode": "3", "signal": null, "ended_at": 1.0}',
         "'returncode' must be an integer or null"),
        ('{"returncode": null, "signal": true, "ended_at": 1.0}',
         "'signal' must be an integer or null"),
        ('{"returncode": 0, "signal": null, "ended_at": "noon"}',
         "'ended_at' must be a time in seconds since 1970"),
        ("[0]", "it holds list, not a JSON object"),
        ("{", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["stop", "status"])
def test_a_damaged_exit_record_is_one_line(
    cli: CliRunner, command: str, text: str, problem: str
) -> None:
    folder = deployment_dir("demo")
    write_state(state_document(folder))
    (folder / "exit.json").write_text(text)
    exit_file = folder / "exit.json"
    assert invoke(cli, command, "demo") == (
        2,
        "",
        f"Error: exit record {exit_file} is unusable: {problem} (hint: delete {exit_file}; "
        "status then goes by the processes alone)\n",
    )


def test_docker_stop_ends_only_its_own_log_capture(stranger: subprocess.Popen[bytes]) -> None:
    import dataclasses

    from sm120.engine.runtime import docker
    from sm120.engine.state import DeploymentState

    folder = deployment_dir("demo")
    state = DeploymentState.from_dict(
        state_document(folder, runtime="docker", container_id="c0ffee")
    )
    ticks = start_ticks(stranger.pid)
    assert ticks is not None
    docker._stop_capture(dataclasses.replace(state, supervisor_pid=stranger.pid,
                                             supervisor_start=ticks + 3))  # fmt: skip
    docker._stop_capture(dataclasses.replace(state, supervisor_pid=stranger.pid))
    time.sleep(0.2)
    assert stranger.poll() is None

    # A process that is what the state says: the capture's module for this container.
    capture = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                docker.CAPTURE_MODULE, "--container", "c0ffee"])  # fmt: skip
    try:
        wait_for(lambda: "c0ffee" in Path(f"/proc/{capture.pid}/cmdline").read_text())
        docker._stop_capture(dataclasses.replace(state, supervisor_pid=capture.pid))
        assert capture.wait(timeout=10) == -15
    finally:
        capture.kill()


def test_stopping_a_capture_never_takes_a_strangers_exit_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The capture dies before _stop_capture looks again (a loaded machine): its exit status
    still belongs to the process that started it, not to the stop."""
    import dataclasses
    import os

    from sm120.engine.runtime import docker
    from sm120.engine.state import DeploymentState

    folder = deployment_dir("demo")
    state = DeploymentState.from_dict(
        state_document(folder, runtime="docker", container_id="c0ffee")
    )
    capture = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                docker.CAPTURE_MODULE, "--container", "c0ffee"])  # fmt: skip

    real_kill = os.kill

    def kill_and_let_it_die(pid: int, signum: int) -> None:
        real_kill(pid, signum)
        # Dead and unreaped (a zombie) before the stop goes on.
        wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z")

    try:
        wait_for(lambda: "c0ffee" in Path(f"/proc/{capture.pid}/cmdline").read_text())
        monkeypatch.setattr(docker.os, "kill", kill_and_let_it_die)
        docker._stop_capture(dataclasses.replace(state, supervisor_pid=capture.pid))
        monkeypatch.undo()
        assert capture.wait(timeout=10) == -15
    finally:
        capture.kill()
