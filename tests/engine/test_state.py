from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from sm120.core.paths import sm120_home
from sm120.engine.state import (
    DeploymentState,
    StateError,
    clear_state,
    deployment_dir,
    list_states,
    load_state,
    save_state,
)


def make_state(name: str = "demo", **changes: object) -> DeploymentState:
    values: dict[str, object] = {
        "name": name,
        "recipe": "tiny-cpu",
        "runtime": "native",
        "supervisor_pid": 1234,
        "engine_pid": 1235,
        "host": "127.0.0.1",
        "port": 8000,
        "plan_hash": "abc123",
        "started_at": 1700000000.5,
        "log_path": f"/tmp/{name}.log",
        "exit_file": f"/tmp/{name}.exit.json",
        "served_model_name": "tiny",
        "model_dir": "/models/tiny",
        "api_key_file": None,
    }
    values.update(changes)
    return DeploymentState(**values)  # type: ignore[arg-type]


def test_home_prefers_sm120_home(isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/elsewhere")
    assert sm120_home() == isolated_home


def test_home_falls_back_to_xdg_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SM120_HOME")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert sm120_home() == tmp_path / "xdg" / "sm120"


def test_home_defaults_to_local_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SM120_HOME")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert sm120_home() == tmp_path / ".local" / "state" / "sm120"


def test_deployment_dir_is_created_under_home(isolated_home: Path) -> None:
    path = deployment_dir("demo")
    assert path == isolated_home / "deployments" / "demo"
    assert path.is_dir()


@pytest.mark.parametrize("bad_name", ["", "../escape", "a/b", ".hidden", "-flag"])
def test_deployment_names_must_be_one_safe_path_component(bad_name: str) -> None:
    with pytest.raises(StateError, match="invalid deployment name"):
        deployment_dir(bad_name)


def test_save_then_load_round_trips() -> None:
    state = make_state()
    save_state(state)
    assert load_state("demo") == state


def test_saved_state_is_private_and_leaves_no_temp_files(isolated_home: Path) -> None:
    path = save_state(make_state())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_save_replaces_previous_state() -> None:
    save_state(make_state(port=8000))
    save_state(make_state(port=9000))
    loaded = load_state("demo")
    assert loaded is not None
    assert loaded.port == 9000


def test_state_file_is_plain_json(isolated_home: Path) -> None:
    save_state(make_state(engine_pid=None))
    data = json.loads((isolated_home / "deployments" / "demo" / "state.json").read_text())
    assert data["engine_pid"] is None
    assert data["supervisor_pid"] == 1234
    assert data["runtime"] == "native"


def test_unknown_keys_from_newer_versions_are_ignored(isolated_home: Path) -> None:
    path = save_state(make_state())
    data = json.loads(path.read_text())
    data["added_in_a_later_version"] = True
    path.write_text(json.dumps(data))
    assert load_state("demo") == make_state()


def test_load_missing_state_is_none() -> None:
    assert load_state("never-started") is None


def test_unreadable_state_names_the_file(isolated_home: Path) -> None:
    path = deployment_dir("broken") / "state.json"
    path.write_text("{not json")
    with pytest.raises(StateError) as caught:
        load_state("broken")
    assert str(path) in caught.value.message
    assert caught.value.hint == f"delete {path} if that deployment is no longer running"


def test_list_states_is_sorted_by_name_and_skips_dirs_without_state() -> None:
    save_state(make_state("zeta"))
    save_state(make_state("alpha"))
    deployment_dir("only-logs")
    assert [state.name for state in list_states()] == ["alpha", "zeta"]


def test_list_states_without_home_is_empty() -> None:
    assert list_states() == []


def test_clear_state_keeps_logs() -> None:
    save_state(make_state())
    log = deployment_dir("demo") / "engine.log"
    log.write_text("engine said things\n")
    clear_state("demo")
    assert load_state("demo") is None
    assert log.read_text() == "engine said things\n"


def test_clear_state_of_unknown_deployment_is_quiet() -> None:
    clear_state("never-started")
    assert load_state("never-started") is None
