"""Run the engine as a local process group, with sm120.engine.runtime.supervise as its parent.

The supervisor leads a new session, so its process id is also the group id: everything the
engine spawns stays in that group, `stop` can end all of it from the saved state alone, and a
Ctrl-C in the launcher's terminal never reaches the engine. The state records when the
supervisor and the engine started, and nothing is signalled unless the group is still
provably theirs (sm120.engine.runtime.processes): a stale state file never hurts a stranger.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path

from sm120.core.defaults import STOP_TIMEOUT_S
from sm120.core.errors import SM120Error
from sm120.engine.background import start_detached
from sm120.engine.log_follow import LogFollower
from sm120.engine.runtime.base import ExitInfo, LaunchSpec, RuntimeStatus
from sm120.engine.runtime.processes import (
    OwnedGroup,
    RecordedProcess,
    find_child_pid,
    start_ticks,
)
from sm120.engine.state import (
    DeploymentState,
    deployment_dir,
    load_state,
    prepare_engine_socket,
    private_dir,
    remove_engine_socket,
    save_state,
)
from sm120.engine.ward import WARD_MODULE, ward_argv

SUPERVISOR_MODULE = "sm120.engine.runtime.supervise"
EXIT_FILE = "exit.json"
RUNTIME_NAME = "native"
SUPERVISOR_LOG = "supervise.log"
POLL_INTERVAL = 0.05
# The supervisor needs a moment to start the engine; the pid is a nicety, not a must.
ENGINE_PID_WAIT = 2.0
WARDED_ENGINE_PID_WAIT = 35.0
# After SIGKILL only the kernel is left to act: this is just how long we watch it do so.
KILL_GRACE = 5.0

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
        try:
            engine_pid = _wait_for_engine_pid(supervisor, warded=spec.engine_socket is not None)
            state = spec.started(
                RUNTIME_NAME,
                started_at,
                log_path,
                exit_file,
                supervisor.pid,
                # Our unreaped child: its /proc entry stays even if it has exited already.
                start_ticks(supervisor.pid),
                engine_pid=engine_pid,
                engine_start=start_ticks(engine_pid) if engine_pid else None,
            )
            save_state(state)
        except BaseException:
            # Ctrl-C (or an error) before the state names the engine: nothing could stop it
            # later, so it is stopped now, its whole group.
            _abandon(supervisor)
            raise
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

    def stop(self, state: DeploymentState, timeout: float = STOP_TIMEOUT_S) -> ExitInfo | None:
        group = owned_group(state)
        if live_members(group):
            # The supervisor is spared so it can record how the engine ended.
            signal_members(group, signal.SIGTERM, spare=group.pgid)
            if not _wait_until(lambda: not live_members(group), timeout):
                _kill_group(group)
        if state.engine_socket and not live_members(group):
            # vLLM leaves its socket file behind; the next start would have to remove it.
            remove_engine_socket(state.engine_socket)
        return self.exit_info(state)

    def status(self, state: DeploymentState) -> RuntimeStatus:
        exit_info = self.exit_info(state)
        group = owned_group(state)
        running = exit_info is None and has_live_member(group)
        pid = None
        if running and group.engine is not None and group.engine.is_running():
            pid = group.engine.pid
        elif running and group.leader.is_running():
            pid = find_child_pid(group.pgid, skip=WARD_MODULE)
        # No end recorded and nothing of ours left: what the state names is someone else's.
        stale = exit_info is None and not running
        return RuntimeStatus(running=running, exit=exit_info, pid=pid, stale=stale)


def owned_group(state: DeploymentState) -> OwnedGroup:
    """The supervisor's process group as the state recorded it."""
    engine = None
    if state.engine_pid is not None and state.engine_start is not None:
        engine = RecordedProcess(state.engine_pid, state.engine_start)
    exit_file = Path(state.exit_file)
    return OwnedGroup(
        # State files from before start times were recorded: the supervisor's command line
        # names its module and this deployment's exit file.
        leader=RecordedProcess(
            state.supervisor_pid,
            state.supervisor_start,
            marker=(SUPERVISOR_MODULE, state.exit_file),
        ),
        engine=engine,
        ended_at=lambda: _ended_at(exit_file),
    )


def _ended_at(exit_file: Path) -> float | None:
    info = ExitInfo.read(exit_file)
    return info.ended_at if info is not None else None


# sm120's own settings: vLLM reads every VLLM_* variable and warns about unknown ones (F17).
SM120_ONLY_VARIABLES = ("VLLM_PYTHON",)


def _inherited_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SM120_ONLY_VARIABLES}


def _never() -> bool:
    return False


def _spawn_supervisor(spec: LaunchSpec, log_path: Path, exit_file: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", SUPERVISOR_MODULE, "--exit-file", str(exit_file)]
    argv += ["--log", str(log_path), *_ward_options(spec), "--", *spec.argv]
    private_dir(log_path.parent)
    # The supervisor writes the engine's output to log_path itself (rotated); its own
    # stdout/stderr only matter if it crashes, and that goes beside the log.
    own_log = log_path.with_name(SUPERVISOR_LOG)
    supervisor = start_detached(argv, own_log, env={**_inherited_env(), **spec.env})
    _started[supervisor.pid] = supervisor
    return supervisor


def _ward_options(spec: LaunchSpec) -> list[str]:
    """The supervisor's --ward-command for a warded engine: the ward holds the port, the
    engine listens on its socket (a stale one from a killed run is removed, or the engine's
    bind would fail)."""
    if spec.engine_socket is None:
        return []
    prepare_engine_socket(spec.engine_socket)
    command = ward_argv(sys.executable, spec.host, spec.port, spec.engine_socket,
                        spec.api_key_file)  # fmt: skip
    return ["--ward-command", json.dumps(command)]


def _wait_for_engine_pid(supervisor: subprocess.Popen[bytes], *, warded: bool) -> int | None:
    # A warded engine starts once its ward holds the port (up to the supervisor's bound).
    deadline = time.monotonic() + (WARDED_ENGINE_PID_WAIT if warded else ENGINE_PID_WAIT)
    while time.monotonic() < deadline and supervisor.poll() is None:
        pid = find_child_pid(supervisor.pid, skip=WARD_MODULE)
        if pid is not None:
            return pid
        time.sleep(POLL_INTERVAL / 2)
    return None


def _abandon(supervisor: subprocess.Popen[bytes]) -> None:
    """Stop a supervisor this process just started, and everything in its session: SIGTERM,
    then SIGKILL after KILL_GRACE. Its pid is ours until it is reaped, so the group is too."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(supervisor.pid, signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            supervisor.wait(timeout=KILL_GRACE)
        if not _group_alive(supervisor.pid):
            break
    _started.pop(supervisor.pid, None)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(group: OwnedGroup) -> None:
    # Engine side first, so the supervisor still records "killed by SIGKILL".
    signal_members(group, signal.SIGKILL, spare=group.pgid)
    if _wait_until(lambda: not live_members(group), KILL_GRACE):
        return
    signal_members(group, signal.SIGKILL, spare=None)
    _wait_until(lambda: not live_members(group), KILL_GRACE)


def live_members(group: OwnedGroup) -> list[int]:
    """The group's live processes; none when it is not provably the one we started."""
    # Supervisors this process started and that have ended are reaped first: a zombie
    # leader would otherwise still look like a member.
    _reap_finished_supervisors()
    return group.members()


def has_live_member(group: OwnedGroup) -> bool:
    """`live_members(group)` is not empty, found without a process scan while the supervisor
    or the engine runs."""
    _reap_finished_supervisors()
    return group.has_live_member()


def signal_members(group: OwnedGroup, signum: int, *, spare: int | None) -> None:
    for pid in live_members(group):
        if pid != spare:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def _reap_finished_supervisors() -> None:
    for pid, supervisor in list(_started.items()):
        if supervisor.poll() is not None:
            del _started[pid]


def _wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


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
