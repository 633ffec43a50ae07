"""launch/: the container entrypoint renders the plan the CLI would, from .env values alone,
and the health check tells a healthy server from a broken one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sm120.images.manifest import make_manifest
from sm120.plan.resolve import PlanRequest, resolve
from sm120.render.argv import render_argv
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.helpers import REPO

LAUNCH = REPO / "launch"


def _manifest(recipe: str, variants: tuple[str, ...] = ()) -> dict[str, object]:
    plan = resolve(PlanRequest(recipe=recipe, variants=variants))
    return make_manifest(plan, tag=plan.image_ref, build_id="b", base_digest=None, patches=[])


@pytest.fixture
def image_files(tmp_path: Path) -> dict[str, Path]:
    """What an image carries, outside one: the manifest (of glm52's image unless a test
    writes another), the engine's recorded interpreter, and where compose mounts .env."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(_manifest("glm52")))
    engine = tmp_path / "engine-python"
    engine.write_text("/opt/venv/bin/python\n")
    return {"manifest": manifest, "engine": engine, "dotenv": tmp_path / "mounted.env"}


def entrypoint(files: dict[str, Path], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    paths = {
        "SM120_ENTRY_MANIFEST": str(files["manifest"]),
        "SM120_ENTRY_ENGINE_PYTHON": str(files["engine"]),
        "SM120_ENTRY_DOTENV": str(files["dotenv"]),
        "SM120_ENTRY_MODEL_DIR": str(files["manifest"].parent / "no-model-here"),
    }
    return subprocess.run(
        [sys.executable, str(LAUNCH / "entrypoint.py"), "--print"],
        env={"PATH": "/usr/bin:/bin", **paths, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_entrypoint_renders_the_cli_plan_from_env(image_files: dict[str, Path]) -> None:
    env = {"RECIPE": "glm52", "VARIANT": "dcp2", "PORT": "8100", "ENABLE_THINKING": "0"}
    result = entrypoint(image_files, env)
    assert result.returncode == 0, result.stderr
    rendered = json.loads(result.stdout)
    plan = resolve(PlanRequest(recipe="glm52", dotenv=env))
    # the engine's interpreter by the absolute path the image recorded
    assert rendered["argv"] == render_argv(plan, python="/opt/venv/bin/python", bind_host="0.0.0.0")
    assert "--reasoning-parser" not in rendered["argv"]
    assert rendered["env"]["NCCL_P2P_DISABLE"] == "1"


def test_entrypoint_reads_the_mounted_env_file(image_files: dict[str, Path]) -> None:
    image_files["dotenv"].write_text(
        "RECIPE=glm52\nIMAGE=sm120/glm52:x\nDCP_SIZE=2\nNCCL_DEBUG=INFO\nHF_TOKEN=hf_secret\n"
    )
    result = entrypoint(image_files, {"RECIPE": "dsv4", "DCP_SIZE": "1"})
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    assert argv[argv.index("--decode-context-parallel-size") + 1] == "2"
    assert "hf_secret" not in result.stdout + result.stderr


def test_entrypoint_without_recipe_fails_in_one_line(image_files: dict[str, Path]) -> None:
    result = entrypoint(image_files, {})
    assert result.returncode == 2
    assert result.stderr == (
        "Error: RECIPE is not set (hint: set RECIPE=<name> in .env (see .env.example))\n"
    )


def test_entrypoint_refuses_a_rule_failure(image_files: dict[str, Path]) -> None:
    result = entrypoint(image_files, {"RECIPE": "glm52", "KV_CACHE_DTYPE": "bfloat16"})
    assert result.returncode == 2
    # glm52's default draws F05b's warning (MTP with a GLM tool parser) before the refusal.
    assert result.stderr.splitlines()[-1].startswith("Error: [F11]")


def test_entrypoint_refuses_a_recipe_the_image_does_not_carry(
    image_files: dict[str, Path],
) -> None:
    result = entrypoint(image_files, {"RECIPE": "dsv4"})
    glm52 = resolve(PlanRequest(recipe="glm52")).image_ref
    dsv4 = resolve(PlanRequest(recipe="dsv4")).image_ref
    assert result.returncode == 2
    assert result.stderr == (
        f"Error: this image ({glm52}) carries recipe glm52, not dsv4: dsv4 runs in {dsv4} "
        "(hint: build it with 'sm120 build dsv4 --write-env' and set IMAGE to it)\n"
    )


def test_entrypoint_refuses_an_engine_the_image_does_not_carry(
    image_files: dict[str, Path],
) -> None:
    # the former default's PR #41834 image, which the variants written on it share
    image_files["manifest"].write_text(json.dumps(_manifest("dsv4", ("pr41834",))))
    result = entrypoint(image_files, {"RECIPE": "dsv4", "VARIANT": "sglang"})
    vllm_image = resolve(PlanRequest(recipe="dsv4", variants=("pr41834",))).image_ref
    sglang_image = resolve(PlanRequest(recipe="dsv4", variants=("sglang",))).image_ref
    assert result.returncode == 2
    assert result.stderr == (
        f"Error: this image ({vllm_image}) carries vllm sm120-pr-41834-stable-preview-20260626;"
        f" the plan (sglang lmsysorg/sglang:deepseek-v4-blackwell) runs in {sglang_image} "
        "(hint: build it with 'sm120 build dsv4 --variant sglang --write-env' and set IMAGE "
        "to it)\n"
    )
    # the vLLM variants share the image, so they start
    assert entrypoint(image_files, {"RECIPE": "dsv4", "VARIANT": "tp4"}).returncode == 0


def test_entrypoint_rejects_a_misspelt_env_key(image_files: dict[str, Path]) -> None:
    """A near miss of a setting is caught where `sm120 launch` catches it, in resolution."""
    image_files["dotenv"].write_text("RECIPE=glm52\nDCP_SZIE=2\n")
    result = entrypoint(image_files, {})
    assert result.returncode == 2
    assert result.stderr == (
        "Error: unknown setting 'DCP_SZIE' in .env; did you mean 'DCP_SIZE'? (hint: fix the "
        "name (see .env.example); a misspelled setting would be ignored)\n"
    )


def test_entrypoint_rejects_a_key_nothing_reads(image_files: dict[str, Path]) -> None:
    """Further from every setting, a key is still refused: no reader of the .env knows it."""
    image_files["dotenv"].write_text("RECIPE=glm52\nTURBO_MODE=1\n")
    result = entrypoint(image_files, {})
    assert result.returncode == 2
    assert result.stderr.startswith(f"Error: {image_files['dotenv']}: unknown key 'TURBO_MODE'")
    assert result.stderr.endswith(
        "(hint: .env.example lists the settings; engine variables must be ones the image's "
        "engine reads)\n"
    )


def test_entrypoint_outside_an_image_says_so(image_files: dict[str, Path]) -> None:
    image_files["manifest"].unlink()
    result = entrypoint(image_files, {"RECIPE": "glm52"})
    assert result.returncode == 2
    assert result.stderr == (
        f"Error: no sm120 manifest at {image_files['manifest']} "
        "(hint: run an image 'sm120 build RECIPE' made)\n"
    )


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
    from tests.helpers import free_port

    result = healthcheck(free_port())
    assert result.returncode == 1
    assert "is not healthy" in result.stderr


def test_entrypoint_prints_the_plans_warnings(image_files: dict[str, Path]) -> None:
    """The same warnings `sm120 launch` shows: NVFP4 DeepSeek-V4 leaves less KV room (F24)."""
    image_files["manifest"].write_text(json.dumps(_manifest("dsv4", ("pr41834",))))
    result = entrypoint(image_files, {"RECIPE": "dsv4", "VARIANT": "nvfp4"})
    assert result.returncode == 0, result.stderr
    warned = [line.split("]:")[0] for line in result.stderr.splitlines()]
    # F40/F41 (coding agents on this fork, whose release order is unknown) come first.
    assert warned == ["sm120: warning [F40", "sm120: warning [F41", "sm120: warning [F24"]
