"""`sm120 launch --json` splits the launch's wall time: sm120's own steps and the engine's."""

from __future__ import annotations

import time
from typing import Any

from sm120.cli.serving import ready_document
from sm120.deploy.launcher import LaunchClock, Ready
from sm120.engine.state import DeploymentState, deployment_dir
from tests.deploy.test_stop_safety import state_document
from tests.helpers import plan_for


def test_the_clock_splits_wall_time_into_consecutive_steps() -> None:
    clock = LaunchClock()
    time.sleep(0.02)
    clock.mark("checks")
    clock.mark("spawn")
    (first, took_first), (second, took_second) = clock.steps
    assert (first, second) == ("checks", "spawn")
    assert took_first >= 0.02 and took_second < 0.02
    assert sum(took for _, took in clock.steps) == clock.last - clock.started


def test_the_json_result_carries_the_split() -> None:
    state = DeploymentState.from_dict(state_document(deployment_dir("demo"), port=18001))
    plan = plan_for("tiny").plan
    wait: Any = None
    ready = Ready(
        state, plan, wait, "ok", phases=[("loading", 1.25)], total_s=3.5,
        steps=[("checks", 0.1), ("spawn", 0.05), ("engine start to API up", 3.0)],
    )  # fmt: skip
    document = ready_document(ready)
    assert document["endpoint"] == "http://127.0.0.1:18001/v1"
    assert document["timings"] == {
        "total_s": 3.5,
        "steps": [
            {"step": "checks", "seconds": 0.1},
            {"step": "spawn", "seconds": 0.05},
            {"step": "engine start to API up", "seconds": 3.0},
        ],
        "engine_phases": [{"phase": "loading", "seconds": 1.25}],
    }


def test_a_clock_started_by_the_session_counts_what_came_before_the_launch() -> None:
    clock = LaunchClock(time.monotonic() - 2.0)
    ((step, took),) = clock.steps
    assert step == "start-up, plan, preflight, weights" and took >= 2.0


def test_the_gate_is_a_step_of_its_own_and_counts_in_the_total() -> None:
    state = DeploymentState.from_dict(state_document(deployment_dir("demo"), port=18001))
    wait: Any = None
    ready = Ready(
        state, plan_for("tiny").plan, wait, "ok", total_s=3.5, steps=[("spawn", 3.5)]
    )  # fmt: skip
    ready.add_step("gate", 12.25)
    timings = ready_document(ready)["timings"]
    assert timings["steps"] == [  # type: ignore[index]
        {"step": "spawn", "seconds": 3.5},
        {"step": "gate", "seconds": 12.25},
    ]
    assert timings["total_s"] == 15.75  # type: ignore[index]
