"""launch/: the container entrypoint renders the plan the CLI would, from .env values alone,
and the health check tells a healthy server from a broken one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sm120.plan import PlanRequest, resolve
from sm120.render.argv import render_argv
from tests.fake_openai_server import FakeOpenAIServer, Reply

LAUNCH = Path(__file__).resolve().parent.parent / "launch"


def entrypoint(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LAUNCH / "entrypoint.py"), "--print"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_entrypoint_renders_the_cli_plan_from_env() -> None:
    env = {"RECIPE": "glm52", "VARIANT": "dcp2", "PORT": "8100", "ENABLE_THINKING": "0"}
    result = entrypoint(env)
    assert result.returncode == 0, result.stderr
    rendered = json.loads(result.stdout)
    plan = resolve(PlanRequest(recipe="glm52", dotenv=env))
    assert rendered["argv"] == render_argv(plan, bind_host="0.0.0.0")
    assert "--reasoning-parser" not in rendered["argv"]
    assert rendered["env"]["NCCL_P2P_DISABLE"] == "1"


def test_entrypoint_without_recipe_fails_in_one_line() -> None:
    result = entrypoint({})
    assert result.returncode == 2
    assert result.stderr == (
        "Error: RECIPE is not set (hint: set RECIPE=<name> in .env (see .env.example))\n"
    )


def test_entrypoint_refuses_a_rule_failure() -> None:
    result = entrypoint({"RECIPE": "glm52", "KV_CACHE_DTYPE": "bfloat16"})
    assert result.returncode == 2
    assert result.stderr.startswith("Error: [F11]")


def healthcheck(port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LAUNCH / "healthcheck.py"), "--port", str(port), *extra],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def test_healthcheck_smoke_passes_on_a_healthy_server() -> None:
    with FakeOpenAIServer(model="tiny") as server:
        port = int(server.url.rsplit(":", 1)[1])
        assert healthcheck(port).returncode == 0
        assert healthcheck(port, "--smoke", "--model", "tiny").returncode == 0


def test_healthcheck_smoke_fails_on_empty_content() -> None:
    with FakeOpenAIServer(model="tiny") as server:
        server.script(Reply(content="", finish_reason="length"))
        port = int(server.url.rsplit(":", 1)[1])
        result = healthcheck(port, "--smoke", "--model", "tiny")
        assert result.returncode == 1
        assert "came back empty" in result.stderr


def test_healthcheck_fails_when_nothing_listens() -> None:
    from tests.integration.realstack import free_port

    result = healthcheck(free_port())
    assert result.returncode == 1
    assert "is not healthy" in result.stderr
