"""Stopping and starting a deployment for a swap, with sm120's own lifecycle code: `stop`
as `sm120 stop` does it, and a start from the launch spec the launch saved (the argv, env
and port it ran with), waiting for READY as `launch` does. A native engine started again
finds its compile cache warm, so it is ready well before a first launch would be."""

from __future__ import annotations

from sm120.core.errors import SM120Error
from sm120.core.net import client_url
from sm120.core.ports import ensure_port_free
from sm120.deploy.monitoring import monitor_files
from sm120.deploy.stop import stop_deployment
from sm120.deploy.wait import wait_until_ready
from sm120.engine.log_capture import start_fresh_log
from sm120.engine.runtime.base import LaunchSpec, Runtime
from sm120.engine.runtime.docker import DockerRuntime
from sm120.engine.runtime.native import NativeRuntime
from sm120.engine.secrets import key_path, read_api_key
from sm120.engine.state import (
    DeploymentState,
    clear_state,
    deployment_dir,
    deployment_lock,
    load_state,
)
from sm120.monitor.files import load_launch_spec
from sm120.server.client import ServerClient

# A swap must not wait on a client that is slow to leave: the engine gets this long.
SWAP_STOP_TIMEOUT_S = 20.0


class StartFailed(SM120Error):
    """The gateway could not start a deployment again."""


def stop_for_swap(name: str) -> None:
    stop_deployment(name, timeout=SWAP_STOP_TIMEOUT_S)


def start_for_swap(name: str, timeout_s: float) -> DeploymentState:
    """Start the deployment from its saved launch spec and return once it serves."""
    spec = load_launch_spec(monitor_files(name).launch_spec, read_api_key(str(key_path(name))))
    if spec is None:
        raise StartFailed(
            f"deployment '{name}' has no saved launch spec",
            f"launch it once with 'sm120 launch ... --name {name}'",
        )
    with deployment_lock(name, "start"):
        current = load_state(name)
        runtime = _runtime(spec)
        if current is not None and runtime.status(current).running:
            return current
        clear_state(name)
        ensure_port_free(spec.host, spec.port)
        log_path = deployment_dir(name) / "logs" / "serve.log"
        start_fresh_log(log_path)
        state = runtime.start(spec, log_path)
        try:
            _wait_ready(runtime, state, timeout_s)
        except BaseException:
            runtime.stop(state, timeout=10.0)
            clear_state(name)
            raise
    return state


def _runtime(spec: LaunchSpec) -> Runtime:
    # Only a container launch renders container arguments into its spec.
    return DockerRuntime() if spec.container is not None else NativeRuntime()


def _wait_ready(runtime: Runtime, state: DeploymentState, timeout_s: float) -> None:
    # A warded engine is asked on its own socket: the gateway waits for the engine, and
    # reaches it as it will reach it for requests (sm120.gateway.backends.Backend.socket).
    with ServerClient(
        client_url(state.host, state.port), read_api_key(state.api_key_file),
        socket=state.engine_socket,
    ) as client:  # fmt: skip
        wait_until_ready(
            lines=runtime.follow(state),
            client=client,
            running=lambda: runtime.status(state).running,
            exit_text=lambda: _exit_text(runtime, state),
            timeout_s=timeout_s,
            on_update=lambda _update, _seconds: None,
            engine="vllm",
        )


def _exit_text(runtime: Runtime, state: DeploymentState) -> str:
    info = runtime.exit_info(state)
    return info.describe() if info else "stopped"
