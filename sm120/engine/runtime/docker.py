"""The Docker runtime: the same start/stop/status/follow contract as the native runtime, with
the engine in a labelled container. Containers are found by label, never by guessed names."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sm120.core.defaults import STOP_TIMEOUT_S
from sm120.core.errors import SM120Error
from sm120.engine import docker_api
from sm120.engine.runtime.base import ExitInfo, LaunchSpec, RuntimeStatus
from sm120.engine.runtime.docker_logs import exit_record
from sm120.engine.runtime.native import EXIT_FILE, ExitFileAndLog
from sm120.engine.runtime.processes import RecordedProcess, start_ticks
from sm120.engine.state import (
    DeploymentState,
    deployment_dir,
    prepare_engine_socket,
    remove_engine_socket,
    save_state,
    write_private_atomically,
)
from sm120.engine.ward import ward_argv

RUNTIME_NAME = "docker"
CAPTURE_MODULE = "sm120.engine.runtime.docker_logs"
DEPLOYMENT_LABEL = "sm120.deployment"


class DockerRuntimeError(SM120Error):
    """The container could not be started."""


class DockerRuntime(ExitFileAndLog):
    kind = RUNTIME_NAME

    def __init__(self, client: Any | None = None) -> None:
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = docker_api.connect()
        return self._client

    def start(self, spec: LaunchSpec, log_path: Path) -> DeploymentState:
        if spec.container is None:
            raise DockerRuntimeError(
                f"nothing to run for deployment {spec.name}: no container plan",
                "launch through 'sm120 launch NAME --runtime docker'",
            )
        self._refuse_if_running(spec.name)
        self._remove_leftovers(spec.name)
        exit_file = deployment_dir(spec.name) / EXIT_FILE
        exit_file.unlink(missing_ok=True)
        ward = None
        if spec.engine_socket is not None:
            # A socket left by a killed run would fail the engine's bind.
            prepare_engine_socket(spec.engine_socket)
            ward = ward_argv(sys.executable, spec.host, spec.port, spec.engine_socket,
                             spec.api_key_file)  # fmt: skip
        started_at = time.time()
        container = docker_api.run_container(self.client, spec.container)
        capture: subprocess.Popen[bytes] | None = None
        try:
            capture = _spawn_capture(container.id, log_path, exit_file, ward)
            state = spec.started(
                RUNTIME_NAME,
                started_at,
                log_path,
                exit_file,
                capture.pid,
                start_ticks(capture.pid),
                container_id=str(container.id),
            )
            save_state(state)
        except BaseException:
            # Ctrl-C (or an error) before the state names the container: `stop` could not
            # find it, and the next launch would refuse it as running. Removed now.
            _abandon(container, capture)
            raise
        return state

    def _refuse_if_running(self, name: str) -> None:
        for container in self.containers_of(name):
            if container.status in ("running", "restarting"):
                raise DockerRuntimeError(
                    f"deployment {name} is already running (container {container.short_id})",
                    f"stop it first: sm120 stop --name {name}",
                )

    def _remove_leftovers(self, name: str) -> None:
        """A stopped container of the same deployment would hold the name: remove it."""
        for container in self.containers_of(name):
            container.remove(force=True)

    def containers_of(self, name: str) -> list[Any]:
        return docker_api.containers_labelled(self.client, {DEPLOYMENT_LABEL: name})

    def _container(self, state: DeploymentState) -> Any | None:
        if state.container_id:
            found = docker_api.get_container(self.client, state.container_id)
            if found is not None:
                return found
        matches = self.containers_of(state.name)
        return matches[0] if matches else None

    def stop(self, state: DeploymentState, timeout: float = STOP_TIMEOUT_S) -> ExitInfo | None:
        """Stop and remove every container of the deployment; record how the engine ended."""
        info = self.exit_info(state)
        for container in self.containers_of(state.name) or _as_list(self._container(state)):
            if container.status in ("running", "restarting", "paused"):
                container.stop(timeout=int(timeout))
            container.reload()
            record = exit_record(container)
            write_private_atomically(Path(state.exit_file), json.dumps(record) + "\n")
            info = ExitInfo.read(Path(state.exit_file))
            container.remove(force=True)
        _stop_capture(state)
        if state.engine_socket:
            remove_engine_socket(state.engine_socket)  # the engine's, left behind
        return info

    def status(self, state: DeploymentState) -> RuntimeStatus:
        container = self._container(state)
        if container is None:
            return RuntimeStatus(running=False, exit=self.exit_info(state), pid=None)
        # A container the restart policy is bringing back is not serving: launch must see the
        # engine died rather than wait out its timeout.
        running = container.status == "running" and not container.attrs["RestartCount"]
        pid = container.attrs.get("State", {}).get("Pid") or None
        exit_info = None if running else self._exit_of(container, state)
        return RuntimeStatus(running=running, exit=exit_info, pid=pid if running else None)

    def _exit_of(self, container: Any, state: DeploymentState) -> ExitInfo | None:
        recorded = ExitInfo.read(Path(state.exit_file))
        if recorded is not None:
            return recorded
        if container.status in ("exited", "dead") or container.attrs["RestartCount"]:
            record = exit_record(container)
            return ExitInfo(record["returncode"], record["signal"], record["ended_at"])
        return None

    def exit_info(self, state: DeploymentState) -> ExitInfo | None:
        recorded = ExitInfo.read(Path(state.exit_file))
        if recorded is not None:
            return recorded
        container = self._container(state)
        return self._exit_of(container, state) if container is not None else None

    def engine_pids(self, state: DeploymentState) -> list[int]:
        """The container's processes as host pids (what py-spy on the host attaches to)."""
        container = self._container(state)
        if container is None or container.status != "running":
            return []
        return docker_api.container_host_pids(container)


def _as_list(container: Any | None) -> list[Any]:
    return [container] if container is not None else []


def _abandon(container: Any, capture: subprocess.Popen[bytes] | None) -> None:
    if capture is not None:
        # SIGTERM first: the capture then stops the ward it keeps (a SIGKILL would orphan it).
        capture.terminate()
        try:
            capture.wait(5)
        except subprocess.TimeoutExpired:
            capture.kill()
            capture.wait()
    # The interrupt or error being raised says more than a failed removal would.
    with contextlib.suppress(Exception):
        container.remove(force=True)


def _spawn_capture(
    container_id: str, log_path: Path, exit_file: Path, ward: list[str] | None
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        CAPTURE_MODULE,
        "--container",
        container_id,
        "--log",
        str(log_path),
        "--exit-file",
        str(exit_file),
    ]
    if ward is not None:
        argv += ["--ward-command", json.dumps(ward)]
    # Its own session: the capture outlives the CLI that launched it, like the container.
    capture = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=os.environ.copy(),
    )
    _started_captures[capture.pid] = capture
    return capture


# The captures this process started, so that stopping one reaps only our own child: a bare
# waitpid on any pid would take the exit status from whoever else is waiting for it.
_started_captures: dict[int, subprocess.Popen[bytes]] = {}


def _stop_capture(state: DeploymentState) -> None:
    # Guard against pid reuse: only signal a process that is still our log capture. Files
    # of older versions have no start time: the capture's command line names the container.
    marker = (CAPTURE_MODULE, state.container_id or "")
    capture = RecordedProcess(state.supervisor_pid, state.supervisor_start, marker)
    if not capture.is_running():
        return
    try:
        os.kill(capture.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    # Reap it when this process started it (the launcher's failure path).
    started = _started_captures.pop(capture.pid, None)
    if started is not None:
        started.poll()
