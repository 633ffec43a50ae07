"""Run the engine as a local process group, with sm120.runtime.supervise as its parent.

The supervisor leads a new session, so its process id is also the group id: everything the
engine spawns stays in that group, `stop` can end all of it from the saved state alone, and a
Ctrl-C in the launcher's terminal never reaches the engine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from sm120.errors import SM120Error
from sm120.monitor.follow import LogFollower
from sm120.runtime.base import ExitInfo, LaunchSpec, RuntimeStatus
from sm120.state import DeploymentState, deployment_dir, load_state, save_state

SUPERVISOR_MODULE = "sm120.runtime.supervise"
EXIT_FILE = "exit.json"
RUNTIME_NAME = "native"
SUPERVISOR_LOG = "supervise.log"
POLL_INTERVAL = 0.05
# The supervisor needs a moment to start the engine; the pid is a nicety, not a must.
ENGINE_PID_WAIT = 2.0
# After SIGKILL only the kernel is left to act: this is just how long we watch it do so.
KILL_GRACE = 5.0
PROC = Path("/proc")

# Supervisors started by this process. Finished ones are reaped so they do not linger as
# zombies, which would still count as members of their process group.
_started: dict[int, subprocess.Popen[bytes]] = {}


class NativeRuntimeError(SM120Error):
    """The engine process could not be started."""


class ExitFileAndLog(ABC):
    """`exit_info` and `follow` for runtimes whose engine's end is recorded in the state's exit
    file and whose output lands in its log file on this machine; `status` says if it runs."""

    @abstractmethod
    def status(self, state: DeploymentState) -> RuntimeStatus: ...

    def exit_info(self, state: DeploymentState) -> ExitInfo | None:
        return ExitInfo.read(Path(state.exit_file))

    def follow(
        self,
        state: DeploymentState,
        from_line: int = 0,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[str]:
        return follow_log(
            Path(state.log_path),
            from_line=from_line,
            stop=stop or _never,
            running=lambda: self.status(state).running,
        )


class NativeRuntime(ExitFileAndLog):
    kind = RUNTIME_NAME

    def start(self, spec: LaunchSpec, log_path: Path) -> DeploymentState:
        if not spec.argv:
            raise NativeRuntimeError(f"nothing to run for deployment {spec.name}: empty argv")
        self._refuse_if_running(spec.name)
        exit_file = deployment_dir(spec.name) / EXIT_FILE
        # A previous run's exit record would make the new engine look dead.
        exit_file.unlink(missing_ok=True)
        started_at = time.time()
        supervisor = _spawn_supervisor(spec, log_path, exit_file)
        state = DeploymentState(
            name=spec.name,
            recipe=spec.recipe,
            runtime=RUNTIME_NAME,
            supervisor_pid=supervisor.pid,
            engine_pid=_wait_for_engine_pid(supervisor),
            host=spec.host,
            port=spec.port,
            plan_hash=spec.plan_hash,
            started_at=started_at,
            log_path=str(log_path),
            exit_file=str(exit_file),
            served_model_name=spec.served_model_name,
            model_dir=spec.model_dir,
            api_key_file=spec.api_key_file,
        )
        save_state(state)
        return state

    def _refuse_if_running(self, name: str) -> None:
        existing = load_state(name)
        if existing is None or existing.runtime != RUNTIME_NAME:
            return
        if self.status(existing).running:
            raise NativeRuntimeError(
                f"deployment {name} is already running (process group {existing.supervisor_pid})",
                hint=f"stop it first: sm120 stop {name}",
            )

    def stop(self, state: DeploymentState, timeout: float = 30.0) -> ExitInfo | None:
        pgid = state.supervisor_pid
        if group_alive(pgid):
            # The supervisor is spared so it can record how the engine ended.
            signal_group_except(pgid, signal.SIGTERM, spare=pgid)
            if not _wait_until(lambda: not group_alive(pgid), timeout):
                _kill_group(pgid)
        return self.exit_info(state)

    def status(self, state: DeploymentState) -> RuntimeStatus:
        _reap_finished_supervisors()
        exit_info = self.exit_info(state)
        running = exit_info is None and group_alive(state.supervisor_pid)
        pid = None
        if running:
            pid = state.engine_pid or find_child_pid(state.supervisor_pid)
        return RuntimeStatus(running=running, exit=exit_info, pid=pid)


# sm120's own settings: vLLM reads every VLLM_* variable and warns about unknown ones (F17).
SM120_ONLY_VARIABLES = ("VLLM_PYTHON",)


def _inherited_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SM120_ONLY_VARIABLES}


def _never() -> bool:
    return False


def _spawn_supervisor(spec: LaunchSpec, log_path: Path, exit_file: Path) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        SUPERVISOR_MODULE,
        "--exit-file",
        str(exit_file),
        "--log",
        str(log_path),
        "--",
        *spec.argv,
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # The supervisor writes the engine's output to log_path itself (rotated); its own
    # stdout/stderr only matter if it crashes, and that goes beside the log.
    own_log = log_path.with_name(SUPERVISOR_LOG)
    log_fd = os.open(own_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        supervisor = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            env={**_inherited_env(), **spec.env},
            start_new_session=True,
        )
    finally:
        os.close(log_fd)
    _started[supervisor.pid] = supervisor
    return supervisor


def _wait_for_engine_pid(supervisor: subprocess.Popen[bytes]) -> int | None:
    deadline = time.monotonic() + ENGINE_PID_WAIT
    while time.monotonic() < deadline and supervisor.poll() is None:
        pid = find_child_pid(supervisor.pid)
        if pid is not None:
            return pid
        time.sleep(POLL_INTERVAL / 2)
    return None


def _kill_group(pgid: int) -> None:
    # Engine side first, so the supervisor still records "killed by SIGKILL".
    signal_group_except(pgid, signal.SIGKILL, spare=pgid)
    if _wait_until(lambda: not group_alive(pgid), KILL_GRACE):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    _wait_until(lambda: not group_alive(pgid), KILL_GRACE)


def _wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


# --- processes, as /proc sees them -------------------------------------------------------


def _reap_finished_supervisors() -> None:
    for pid, supervisor in list(_started.items()):
        if supervisor.poll() is not None:
            del _started[pid]


def group_alive(pgid: int) -> bool:
    _reap_finished_supervisors()
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg also succeeds for zombies, which are dead; /proc tells them apart.
    return not PROC.is_dir() or bool(group_members(pgid))


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of the process group."""
    members = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and fields.pgrp == pgid and fields.state != "Z":
            members.append(int(entry.name))
    return members


def signal_group_except(pgid: int, signum: int, *, spare: int) -> None:
    if not PROC.is_dir():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signum)
        return
    for pid in group_members(pgid):
        if pid != spare:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def find_child_pid(parent: int) -> int | None:
    children = _children_from_task_files(parent)
    if not children:
        children = _children_from_stat_scan(parent)
    return min(children) if children else None


def _children_from_task_files(parent: int) -> list[int]:
    children: list[int] = []
    for task_children in PROC.glob(f"{parent}/task/*/children"):
        with contextlib.suppress(OSError):
            children += [int(pid) for pid in task_children.read_text().split()]
    return children


def _children_from_stat_scan(parent: int) -> list[int]:
    children = []
    for entry in PROC.glob("[0-9]*"):
        fields = _stat_fields(int(entry.name))
        if fields is not None and fields.ppid == parent:
            children.append(int(entry.name))
    return children


class _StatFields(NamedTuple):
    state: str
    ppid: int
    pgrp: int


def _stat_fields(pid: int) -> _StatFields | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    after_name = text[text.rfind(")") + 2 :].split()
    return _StatFields(state=after_name[0], ppid=int(after_name[1]), pgrp=int(after_name[2]))


# --- logs --------------------------------------------------------------------------------


def follow_log(
    path: Path,
    *,
    from_line: int,
    stop: Callable[[], bool],
    running: Callable[[], bool],
) -> Iterator[str]:
    """Like tail -F from line `from_line` of the current file: ends on stop(), or once the
    writer is gone and everything it wrote has been yielded. Follows rotations."""
    follower = LogFollower(path)
    lines_seen = 0
    try:
        while True:
            for line in follower.read_lines():
                lines_seen += 1
                if lines_seen > from_line:
                    yield line
                    if stop():
                        return
            if stop():
                return
            if not running():
                # Whatever was written before the exit is in the file now: drain it.
                for line in [*follower.read_lines(), *follower.rest()]:
                    lines_seen += 1
                    if lines_seen > from_line:
                        yield line
                return
            time.sleep(POLL_INTERVAL)
    finally:
        follower.close()
