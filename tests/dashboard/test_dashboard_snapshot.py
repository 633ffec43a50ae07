"""What the snapshot makes of the state directory: a stopped deployment from its launch spec,
failure alerts split into id and fix, bench runs beside their references."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sm120.dashboard.snapshot import _alert, snapshot
from sm120.deploy.monitoring import monitor_files
from sm120.engine.runtime.base import LaunchSpec
from sm120.measure import history
from sm120.monitor.files import save_launch_spec


def _stopped(name: str, env: dict[str, str]) -> None:
    spec = LaunchSpec(
        name=name, recipe="tiny", argv=("vllm", "serve"), env=env, host="127.0.0.1",
        port=8123, plan_hash="abc", served_model_name="tiny-m", model_dir=None,
        api_key_file=None,
    )  # fmt: skip
    save_launch_spec(monitor_files(name).launch_spec, spec)


def test_a_stopped_deployment_is_listed_from_its_launch_spec() -> None:
    _stopped("tiny", {"CUDA_VISIBLE_DEVICES": "2,3"})
    (row,) = snapshot({}, None)["deployments"]
    assert row["name"] == "tiny" and row["recipe"] == "tiny"
    assert (row["running"], row["phase"], row["asleep"]) == (False, "stopped", False)
    assert row["endpoint"] == "http://127.0.0.1:8123/v1"
    assert row["served_model_name"] == "tiny-m"
    assert row["gpu_indices"] == [2, 3]


def test_the_gateways_aliases_are_listed_with_their_deployment() -> None:
    _stopped("tiny", {})
    _stopped("other", {})
    gateway = {"name": "gateway", "aliases": {"claude-*": "tiny", "gpt-5": "tiny", "x": "other"}}
    rows = {row["name"]: row for row in snapshot({}, gateway)["deployments"]}
    assert rows["tiny"]["aliases"] == ["claude-*", "gpt-5"]
    assert rows["other"]["aliases"] == ["x"]
    assert snapshot({}, None)["deployments"][0]["aliases"] == []


def test_a_catalogue_failure_alert_names_its_id_and_fix() -> None:
    alert = {"at": "t", "kind": "failure", "message": "F08 NCCL hangs. Fix: set NCCL_P2P_DISABLE=1"}
    assert _alert(alert) | {} == {**alert, "failure_id": "F08", "fix": "set NCCL_P2P_DISABLE=1"}
    other = {"at": "t", "kind": "wedge", "message": "F08 looks like an id. Fix: but is not"}
    assert (_alert(other)["failure_id"], _alert(other)["fix"]) == (None, None)


def test_bench_runs_come_with_the_published_figure_and_roofline() -> None:
    _stopped("tiny", {})
    history.append({"deployment": "other", "decode": {"tps": 1.0}})
    for tps in (40.0, 42.5):
        history.append({
            "deployment": "tiny", "time": f"run-{tps}", "mode": "quick",
            "decode": {"tps": tps, "ttft_s": 0.2},
            "against": {"published_decode_tok_s": 50.0, "published_source": "seed",
                        "roofline_decode_tok_s": 80.0},
        })  # fmt: skip
    (row,) = snapshot({}, None)["deployments"]
    assert [run["decode_tok_s"] for run in row["bench"]] == [40.0, 42.5]
    assert row["bench"][-1] == {
        "time": "run-42.5", "mode": "quick", "decode_tok_s": 42.5, "ttft_s": 0.2,
        "published_decode_tok_s": 50.0, "published_source": "seed", "roofline_decode_tok_s": 80.0,
    }  # fmt: skip


def test_a_status_row_is_read_again_only_when_old_changed_or_forgotten(monkeypatch: Any) -> None:
    from sm120.dashboard import routes
    from sm120.engine.state import DeploymentState

    reads: list[str] = []
    monkeypatch.setattr(routes, "describe", lambda state: reads.append(state.name) or {})
    clock = [100.0]
    monkeypatch.setattr(routes.time, "monotonic", lambda: clock[0])
    state = DeploymentState(
        name="tiny", recipe="tiny", runtime="native", supervisor_pid=1, engine_pid=2,
        host="127.0.0.1", port=8000, plan_hash="h", started_at=1.0, log_path="l",
        exit_file="e", served_model_name="tiny", model_dir=None, api_key_file=None,
    )  # fmt: skip
    board = routes.Board(controls=None)  # type: ignore[arg-type]
    board._row(state)
    clock[0] += routes.STATUS_ROW_TTL_S - 1
    board._row(state)
    assert reads == ["tiny"]
    board._row(replace(state, started_at=2.0))  # launched again: a new state
    clock[0] += routes.STATUS_ROW_TTL_S + 1
    board._row(replace(state, started_at=2.0))
    board.forget()
    board._row(replace(state, started_at=2.0))
    assert reads == ["tiny"] * 4
