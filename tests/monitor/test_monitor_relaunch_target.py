"""The monitor's restart of a deployment that one argv cannot describe: the Relaunch handed
in runs under the deployment's lock, a stopped or replaced deployment is never relaunched,
and whatever state the relaunch saved - even one that failed half-way - stays the monitor's
own, so the next poll does not mistake it for somebody else's launch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from sm120.core.errors import SM120Error
from sm120.engine.state import DeploymentState, deployment_dir, save_state
from sm120.monitor.files import MonitorFiles
from sm120.monitor.watched import DeploymentTarget, RestartFailed


def recorded(name: str = "tiny", supervisor_pid: int = 101) -> DeploymentState:
    folder = deployment_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    state = DeploymentState(
        name=name,
        recipe="tiny",
        runtime="cluster",
        supervisor_pid=supervisor_pid,
        engine_pid=None,
        host="127.0.0.1",
        port=8000,
        plan_hash="h",
        started_at=1.0,
        log_path=str(folder / "logs" / "serve.log"),
        exit_file=str(folder / "exit.json"),
        served_model_name="tiny",
        model_dir=None,
        api_key_file=None,
    )
    save_state(state)
    return state


class Relaunches:
    """Saves a new state as the real one does, then succeeds or fails."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[int, float, bool]] = []

    def __call__(
        self, state: DeploymentState, stop_timeout_s: float, cancelled: Callable[[], bool]
    ) -> DeploymentState:
        self.calls.append((state.supervisor_pid, stop_timeout_s, cancelled()))
        new = dataclasses.replace(state, supervisor_pid=state.supervisor_pid + 1)
        save_state(new)
        if self.fail:
            raise SM120Error("node1 (b): ssh: connect to host b port 22: No route", "check b")
        return new


def target_for(relaunch: Relaunches | None, stopping: bool = False) -> DeploymentTarget:
    files = MonitorFiles(deployment_dir("tiny"))
    return DeploymentTarget("tiny", files, relaunch=relaunch, cancelled=lambda: stopping)


def test_a_relaunch_replaces_the_launch_spec(isolated_home: Path) -> None:
    recorded()
    assert not target_for(None).can_restart()  # several nodes, nothing handed in
    relaunch = Relaunches()
    target = target_for(relaunch, stopping=True)
    assert target.can_restart()
    target.restart(12.0)
    # The monitor's stop signal reaches the relaunch, which checks it between its steps.
    assert relaunch.calls == [(101, 12.0, True)]
    assert target.state.supervisor_pid == 102 and not target.gone()
    assert target.server().identity == "cluster:102"


def test_a_failed_relaunch_still_owns_what_it_saved(isolated_home: Path) -> None:
    recorded()
    target = target_for(Relaunches(fail=True))
    with pytest.raises(SM120Error, match="No route"):
        target.restart(30.0)
    assert target.state.supervisor_pid == 102
    assert not target.gone()  # the monitor stays, to retry under its breaker or give up


def test_a_deployment_stopped_or_replaced_meanwhile_is_not_relaunched(
    isolated_home: Path,
) -> None:
    recorded()
    relaunch = Relaunches()
    target = target_for(relaunch)
    recorded(supervisor_pid=555)  # somebody launched it again
    with pytest.raises(RestartFailed) as caught:
        target.restart(30.0)
    assert caught.value.one_line() == (
        "tiny was stopped or replaced meanwhile (hint: nothing to do)"
    )
    assert relaunch.calls == []
