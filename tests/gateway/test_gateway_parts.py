"""The gateway's parts below the HTTP layer: discovery from state files, the host-RAM check
for sleeping weights, the sleep/wake calls, and starting a deployment with no saved spec."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sm120.deploy.monitoring import keep_launch_spec
from sm120.engine.runtime.base import LaunchSpec
from sm120.engine.secrets import ensure_api_key
from sm120.engine.state import DeploymentState, deployment_dir, save_state
from sm120.gateway.actions import EngineActions, host_ram_shortfall
from sm120.gateway.backends import discover
from sm120.gateway.restart import StartFailed, start_for_swap
from sm120.gateway.swap import SwapFailed
from sm120.plan.fit.sleep import GIB, sleep_shortfall, weights_bytes
from tests.fakes.gateway import backend


def _spec(
    name: str, model: str, port: int, argv: tuple[str, ...] = ("vllm", "serve")
) -> LaunchSpec:
    return LaunchSpec(
        name=name, recipe="tiny", argv=argv, env={"VLLM_API_KEY": "secret"}, host="127.0.0.1",
        port=port, plan_hash="h", served_model_name=model, model_dir=None,
        api_key_file=str(ensure_api_key(name, "secret")),
    )  # fmt: skip


def _state(name: str, model: str, port: int, model_dir: str | None = None) -> DeploymentState:
    # A pid that no process has now (PID_MAX is above any real one): the state is not running.
    return DeploymentState(
        name=name, recipe="tiny", runtime="native", supervisor_pid=4_194_303, engine_pid=None,
        host="127.0.0.1", port=port, plan_hash="h", started_at=time.time(),
        log_path="/nonexistent/serve.log", exit_file="/nonexistent/exit.json",
        served_model_name=model, model_dir=model_dir, api_key_file=str(ensure_api_key(name, None)),
    )  # fmt: skip


def test_discovery_reads_states_and_saved_launch_specs() -> None:
    save_state(_state("dead", "m-dead", 9001))
    keep_launch_spec(_spec("parked", "m-parked", 9002, argv=("vllm", "--enable-sleep-mode")))
    deployment_dir("empty")  # a folder with neither: nothing to route to
    found = discover()
    assert sorted(found) == ["m-dead", "m-parked"]
    dead, parked = found["m-dead"], found["m-parked"]
    assert (dead.deployment, dead.running, dead.startable) == ("dead", False, False)
    assert (parked.base_url, parked.running, parked.startable, parked.sleep_mode) == (
        "http://127.0.0.1:9002",
        False,
        True,
        True,
    )
    assert parked.api_key == "secret"


def test_discovery_skips_an_unusable_state_file() -> None:
    (deployment_dir("broken") / "state.json").write_text("{not json")
    keep_launch_spec(_spec("fine", "m-fine", 9003))
    assert sorted(discover()) == ["m-fine"]


def test_sleep_shortfall_names_the_memory() -> None:
    assert sleep_shortfall(10 * GIB, 20 * GIB) is None
    assert sleep_shortfall(10 * GIB, 12 * GIB) == (
        "sleeping needs 10.0 GiB of host RAM for the weights plus 4 GiB kept free, and "
        "12.0 GiB is available"
    )


def test_host_ram_check_reads_the_weights_and_meminfo(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    (model / "config.json").write_text("{}")
    assert weights_bytes(model) == 4096
    save_state(_state("big", "m-big", 9004, model_dir=str(model)))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000000 kB\nMemAvailable: 1024 kB\n")
    shortfall = host_ram_shortfall(backend("m-big", "http://x", deployment="big"), meminfo)
    assert shortfall == (
        "sleeping needs 0.0 GiB of host RAM for the weights plus 4 GiB kept free, and "
        "0.0 GiB is available"
    )
    meminfo.write_text("MemTotal: 80000000 kB\nMemAvailable: 60000000 kB\n")
    assert host_ram_shortfall(backend("m-big", "http://x", deployment="big"), meminfo) is None


def test_start_without_a_saved_spec_is_refused() -> None:
    with pytest.raises(StartFailed) as raised:
        start_for_swap("never-launched", timeout_s=5)
    assert raised.value.one_line() == (
        "deployment 'never-launched' has no saved launch spec "
        "(hint: launch it once with 'sm120 launch ... --name never-launched')"
    )


def _sleepy_engine(calls: list[str], sleep_routes: bool) -> web.Application:
    async def record(request: web.Request) -> web.Response:
        calls.append(f"{request.method} {request.path_qs} {request.headers.get('Authorization')}")
        return web.json_response({"status": "ok"})

    async def is_sleeping(_request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": True})

    app = web.Application()
    if sleep_routes:
        app.router.add_post("/sleep", record)
        app.router.add_post("/wake_up", record)
        app.router.add_get("/is_sleeping", is_sleeping)
    return app


def _actions_against(sleep_routes: bool, *steps: str) -> tuple[list[str], Any]:
    calls: list[str] = []

    async def scenario() -> Any:
        server = TestServer(_sleepy_engine(calls, sleep_routes))
        await server.start_server()
        target = backend("m", str(server.make_url("")).rstrip("/"), api_key="k", sleep_mode=True)
        try:
            async with aiohttp.ClientSession() as session:
                actions = EngineActions(session)
                for step in steps:
                    answer = await getattr(actions, step)(target)
                    if answer is not None:
                        calls.append(f"{step} -> {answer}")
        except SwapFailed as exc:
            return exc.one_line()
        finally:
            await server.close()
        return None

    return calls, asyncio.run(scenario())


def test_sleep_and_wake_call_the_engine_with_its_key() -> None:
    calls, error = _actions_against(True, "wake", "sleep")
    assert error is None
    assert calls[0] == "POST /wake_up Bearer k"
    # No model_dir in the state (there is none): the RAM check has nothing to weigh.
    assert calls[1] == "POST /sleep?level=1 Bearer k"


def test_whether_an_engine_sleeps_is_asked_and_unknown_means_awake() -> None:
    assert _actions_against(True, "is_sleeping") == (["is_sleeping -> True"], None)
    assert _actions_against(False, "is_sleeping") == (["is_sleeping -> False"], None)


def test_an_engine_without_sleep_routes_says_how_to_get_them() -> None:
    _, error = _actions_against(False, "wake")
    assert error == (
        "deployment dep-m has no /wake_up endpoint (hint: launch it with --set "
        "enable-sleep-mode=true and --set env.VLLM_SERVER_DEV_MODE=1)"
    )
