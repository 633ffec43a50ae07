"""A multi-node launch that failed stops through the one stop sequence
(sm120.deploy.cluster.abandon_start); a node it cannot reach hides neither the launch's own
error nor keeps the state. Whole launches failing are tests/engine/test_cluster_launch.py."""

from __future__ import annotations

from pathlib import Path

from sm120.core.defaults import STOP_TIMEOUT_S
from sm120.deploy.cluster import abandon_start
from sm120.deploy.launcher import ABANDON_TIMEOUT_S
from sm120.engine.cluster.node import NodeError
from sm120.engine.cluster.runtime import RUNTIME_NAME, ClusterRuntime
from sm120.engine.runtime.base import ExitInfo, RuntimeStatus
from sm120.engine.state import DeploymentState, deployment_dir, load_state, save_state


class ScriptedRuntime(ClusterRuntime):
    def __init__(self, unreachable: bool) -> None:
        self.unreachable = unreachable
        self.stops: list[float] = []

    def status(self, state: DeploymentState) -> RuntimeStatus:
        return RuntimeStatus(running=True, exit=None, pid=None)

    def stop(self, state: DeploymentState, timeout: float = STOP_TIMEOUT_S) -> ExitInfo | None:
        self.stops.append(timeout)
        if self.unreachable:
            raise NodeError("node1 (node-b): ssh failed", "check ssh")
        return None


def _saved_state() -> DeploymentState:
    folder = deployment_dir("tiny")
    state = DeploymentState(
        name="tiny", recipe="tiny", runtime=RUNTIME_NAME, supervisor_pid=999_999,
        engine_pid=None, host="127.0.0.1", port=8000, plan_hash="0" * 16, started_at=0.0,
        log_path=str(folder / "logs" / "serve.log"), exit_file=str(folder / "exit.json"),
        served_model_name="tiny", model_dir=None, api_key_file=None,
    )  # fmt: skip
    save_state(state)
    return state


def test_a_failed_start_stops_every_node_and_forgets_the_state(tmp_path: Path) -> None:
    runtime = ScriptedRuntime(unreachable=False)
    abandon_start(_saved_state(), runtime)
    assert runtime.stops == [ABANDON_TIMEOUT_S]
    assert load_state("tiny") is None


def test_an_unreachable_node_neither_raises_nor_keeps_the_state(tmp_path: Path) -> None:
    runtime = ScriptedRuntime(unreachable=True)
    abandon_start(_saved_state(), runtime)
    assert runtime.stops == [ABANDON_TIMEOUT_S]
    assert load_state("tiny") is None
