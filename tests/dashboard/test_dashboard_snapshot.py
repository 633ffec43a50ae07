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


# One malformed folder is named in its own row; its neighbours are shown as they are.


def _running(name: str, exit_file: str = "/nonexistent/exit.json") -> None:
    import time as clock

    from sm120.engine.state import DeploymentState, save_state

    save_state(
        DeploymentState(
            name=name, recipe="tiny", runtime="native", supervisor_pid=4_194_303,
            engine_pid=None, host="127.0.0.1", port=8124, plan_hash="h",
            started_at=clock.time(), log_path="/nonexistent/serve.log", exit_file=exit_file,
            served_model_name=name, model_dir=None, api_key_file=None,
        )
    )  # fmt: skip


def _strict(document: dict[str, Any]) -> dict[str, Any]:
    import json

    # What the browser's JSON.parse takes: no NaN, no Infinity.
    parsed: dict[str, Any] = json.loads(json.dumps(document, allow_nan=False))
    return parsed


def _rows(status_row: Any = None) -> dict[str, dict[str, Any]]:
    document = snapshot({}, None, status_row) if status_row else snapshot({}, None)
    return {row["name"]: row for row in _strict(document)["deployments"]}


def _live(name: str, live: object, raw: str | None = None) -> None:
    import json

    from sm120.engine.state import deployment_dir

    own = deployment_dir(name) / "monitor"
    own.mkdir(parents=True, exist_ok=True)
    (own / "live.json").write_text(raw if raw is not None else json.dumps(live))


def _row_of(state: Any) -> dict[str, Any]:
    return {"name": state.name, "running": True, "health": 200}


def test_monitor_alerts_of_the_wrong_type_or_nested_deep_are_left_out() -> None:
    _stopped("good", {})
    for name in ("strings", "number", "deep"):
        _running(name)
    _live("strings", {"alerts": ["not", "objects"], "phase": "ready"})
    _live("number", {"alerts": 7, "gpus": "x"})
    _live("deep", None, raw="[" * 50_000 + "]" * 50_000)
    rows = _rows(_row_of)
    assert rows["good"]["phase"] == "stopped"
    assert rows["strings"]["alerts"] == [] and rows["strings"]["phase"] == "ready"
    assert rows["number"]["alerts"] == [] and rows["deep"]["alerts"] == []


def test_nan_and_infinity_from_an_engine_are_null_not_invalid_json() -> None:
    _running("nan")

    def row(state: Any) -> dict[str, Any]:
        return {**_row_of(state), "kv_cache_usage_pct": float("nan"), "x": [float("inf")]}

    rows = _rows(row)
    assert rows["nan"]["kv_cache_usage_pct"] is None and rows["nan"]["x"] == [None]


def test_an_absurd_exit_record_names_its_folder_and_spares_the_rest(tmp_path: Any) -> None:
    exit_file = tmp_path / "exit.json"
    exit_file.write_text('{"returncode": 1, "ended_at": 1e300}')
    _running("absurd", exit_file=str(exit_file))
    _stopped("good", {})
    rows = _rows()
    assert rows["good"]["phase"] == "stopped"
    assert rows["absurd"]["phase"] == "unreadable"
    assert rows["absurd"]["error"] == (
        f"exit record {exit_file} is unusable: 'ended_at' must be a time in seconds since 1970 "
        f"(hint: delete {exit_file}; status then goes by the processes alone)"
    )


def test_a_launch_record_with_a_wrong_type_is_named() -> None:
    import json

    _stopped("good", {})
    _stopped("typed", {})
    path = monitor_files("typed").launch_spec
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "port": "8123", "argv": "vllm serve"}))
    rows = _rows()
    assert rows["good"]["phase"] == "stopped"
    assert rows["typed"]["phase"] == "unreadable"
    assert rows["typed"]["error"] == (
        f"launch record {path} is unusable (damaged, or not one sm120 wrote) "
        "(hint: launch it again with 'sm120 launch <recipe> --name typed')"
    )


def test_any_defect_in_one_row_stays_in_that_row() -> None:
    _running("broken")
    _stopped("good", {})

    def row(state: Any) -> dict[str, Any]:
        raise TypeError("'NoneType' object is not subscriptable")

    rows = _rows(row)
    assert rows["good"]["phase"] == "stopped"
    assert rows["broken"]["error"] == "TypeError: 'NoneType' object is not subscriptable"


def test_bench_history_lines_of_the_wrong_shape_do_not_break_the_chart() -> None:
    _stopped("tiny", {})
    history.append({"deployment": "tiny", "decode": "fast", "against": [1]})
    history.append({"deployment": "tiny", "decode": {"tps": float("nan"), "ttft_s": [[1]]}})
    (row,) = _strict(snapshot({}, None))["deployments"]
    assert [(p["decode_tok_s"], p["ttft_s"]) for p in row["bench"]] == [(None, None)] * 2
