"""Find the deployment a command is about, through the state directory."""

from __future__ import annotations

from sm120.core.errors import SM120Error
from sm120.engine.cluster.runtime import ClusterRuntime
from sm120.engine.runtime.base import Runtime
from sm120.engine.runtime.docker import DockerRuntime
from sm120.engine.runtime.native import NativeRuntime
from sm120.engine.state import DeploymentState, list_states, load_state


class NoDeployment(SM120Error):
    """No deployment matches."""


def runtime_for(state: DeploymentState) -> Runtime:
    if state.runtime == "native":
        return NativeRuntime()
    if state.runtime == "docker":
        return DockerRuntime()
    if state.runtime == "cluster":
        return ClusterRuntime()
    raise NoDeployment(
        f"deployment {state.name} uses unknown runtime '{state.runtime}'", "upgrade sm120"
    )


def find_deployment(name: str | None) -> DeploymentState:
    if name:
        state = load_state(name)
        if state is None:
            raise NoDeployment(
                f"no deployment named '{name}'",
                "'sm120 status' lists them; start one with 'sm120 launch'",
            )
        return state
    states = list_states()
    if not states:
        raise NoDeployment("no deployment is running", "start one: sm120 launch tiny")
    if len(states) > 1:
        names = ", ".join(s.name for s in states)
        raise NoDeployment(f"several deployments exist ({names})", "pick one with --name")
    return states[0]
