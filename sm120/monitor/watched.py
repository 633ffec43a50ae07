"""What the monitor watches: a deployment sm120 started (it can restart it), or only a URL
(a compose service, where the container runtime owns the server)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httpx

from sm120.core.errors import SM120Error
from sm120.core.net import client_url, is_ipv6
from sm120.engine.find import runtime_for
from sm120.engine.runtime.base import ExitInfo
from sm120.engine.runtime.docker import DockerRuntime
from sm120.engine.runtime.native import live_members, owned_group
from sm120.engine.secrets import read_api_key
from sm120.engine.state import DeploymentState, deployment_lock, load_state
from sm120.monitor.files import MonitorFiles, load_launch_spec

PORT_RELEASE_WAIT_S = 30.0


class RestartFailed(SM120Error):
    """The watchdog could not start the server again."""


@dataclass(frozen=True)
class ServerState:
    running: bool
    identity: str | None
    """Changes when the server is started again (a new process group, a new container)."""
    exit: ExitInfo | None = None


class Relaunch(Protocol):
    """Starts a deployment again that one argv cannot describe (several nodes, each with its
    preflight). Handed in by the layer that launches such deployments, so this package
    never imports it. Called under the deployment's lock; returns the new state. It checks
    `cancelled()` (a `sm120 stop` arrived) between its steps and then ends with nothing of
    the deployment running."""

    def __call__(
        self, state: DeploymentState, stop_timeout_s: float, cancelled: Callable[[], bool]
    ) -> DeploymentState: ...


class Target(Protocol):
    @property
    def base_url(self) -> str: ...

    def api_key(self) -> str | None: ...

    def server(self) -> ServerState: ...

    def engine_pids(self) -> list[int]:
        """Processes worth a py-spy dump (empty when they are out of reach)."""
        ...

    def can_restart(self) -> bool: ...

    def restart(self, stop_timeout_s: float) -> None: ...

    def stop_server(self, stop_timeout_s: float) -> None:
        """End whatever is left of a dead server for good; the deployment stays recorded."""
        ...

    def gone(self) -> bool:
        """The deployment was stopped or replaced: the monitor's job is over."""
        ...


class DeploymentTarget:
    """A deployment in the state dir, through its runtime."""

    def __init__(
        self,
        name: str,
        files: MonitorFiles,
        *,
        relaunch: Relaunch | None = None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        self.name = name
        self.files = files
        self._relaunch = relaunch
        self._cancelled = cancelled
        state = load_state(name)
        if state is None:
            raise SM120Error(f"no deployment named '{name}'", "start one with 'sm120 launch' first")
        self.state: DeploymentState = state
        # Our own restarts change the state; anybody else's mean a new owner.
        self._expected_group = state.supervisor_pid

    @property
    def base_url(self) -> str:
        return client_url(self.state.host, self.state.port)

    def api_key(self) -> str | None:
        return read_api_key(self.state.api_key_file)

    def _refresh(self) -> DeploymentState | None:
        state = load_state(self.name)
        if state is not None:
            self.state = state
        return state

    def gone(self) -> bool:
        state = self._refresh()
        return state is None or state.supervisor_pid != self._expected_group

    def server(self) -> ServerState:
        status = runtime_for(self.state).status(self.state)
        identity = f"{self.state.runtime}:{self.state.supervisor_pid}"
        return ServerState(running=status.running, identity=identity, exit=status.exit)

    def engine_pids(self) -> list[int]:
        if self.state.runtime == "docker":
            return DockerRuntime().engine_pids(self.state)
        if self.state.runtime != "native":
            return []

        group = owned_group(self.state)
        return sorted(pid for pid in live_members(group) if pid != group.pgid)

    def can_restart(self) -> bool:
        return self._relaunch is not None or self.files.launch_spec.is_file()

    def restart(self, stop_timeout_s: float) -> None:
        if self._relaunch is not None:
            self._restart_by_relaunch(self._relaunch, stop_timeout_s)
            return
        spec = load_launch_spec(self.files.launch_spec, self.api_key())
        if spec is None:
            raise RestartFailed(f"no launch spec saved for {self.name}", "launch it again")
        # A user's stop or launch of this deployment wins: it is about to end this monitor.
        with deployment_lock(self.name, "restart"):
            if self.gone():
                raise RestartFailed(
                    f"{self.name} was stopped or replaced meanwhile", "nothing to do"
                )
            runtime = runtime_for(self.state)
            runtime.stop(self.state, timeout=stop_timeout_s)
            _wait_for_port(self.state.host, self.state.port)
            new_state = runtime.start(spec, self.files.serve_log)
        self.state = new_state
        self._expected_group = new_state.supervisor_pid

    def _restart_by_relaunch(self, relaunch: Relaunch, stop_timeout_s: float) -> None:
        with deployment_lock(self.name, "restart"):
            if self.gone():
                raise RestartFailed(
                    f"{self.name} was stopped or replaced meanwhile", "nothing to do"
                )
            try:
                self.state = relaunch(self.state, stop_timeout_s, self._cancelled)
            finally:
                # Under the lock nobody else writes the state: whatever the relaunch saved,
                # even one that failed half-way, is this deployment, not a replacement.
                current = load_state(self.name)
                if current is not None:
                    self.state = current
                self._expected_group = self.state.supervisor_pid

    def stop_server(self, stop_timeout_s: float) -> None:
        # Leftover workers, a stopped container: gone. The state stays, so `sm120 status`
        # still shows how the server ended and why it was not brought back.
        with deployment_lock(self.name, "stop"):
            if not self.gone():
                runtime_for(self.state).stop(self.state, timeout=stop_timeout_s)


def _wait_for_port(host: str, port: int) -> None:
    deadline = time.monotonic() + PORT_RELEASE_WAIT_S
    family = socket.AF_INET6 if is_ipv6(host) else socket.AF_INET
    while time.monotonic() < deadline:
        with socket.socket(family) as probe:
            # As the server will bind: its old connections in TIME_WAIT are no obstacle.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host or "0.0.0.0", port))
                return
            except OSError:
                time.sleep(0.5)


class UrlTarget:
    """Only an address: health tells whether it runs; restarts are the runtime's business."""

    def __init__(self, base_url: str, api_key: str | None) -> None:
        self._base_url = base_url.rstrip("/")
        self._api_key = api_key

    @property
    def base_url(self) -> str:
        return self._base_url

    def api_key(self) -> str | None:
        return self._api_key

    def server(self) -> ServerState:
        try:
            # Any answer means it runs; the body is never read.
            with httpx.stream("GET", f"{self._base_url}/health", timeout=5.0):
                pass
        except httpx.HTTPError:
            return ServerState(running=False, identity=None)
        return ServerState(running=True, identity=None)

    def engine_pids(self) -> list[int]:
        return []

    def can_restart(self) -> bool:
        return False

    def restart(self, stop_timeout_s: float) -> None:
        raise RestartFailed("a server known only by its URL cannot be restarted from here")

    def stop_server(self, stop_timeout_s: float) -> None:
        return None  # its runtime owns it

    def gone(self) -> bool:
        return False
