"""A route the image's own launcher runs (dsv4 -V r7): its command as is, its knobs rendered,
the plan's flags reaching it only through the knobs that carry them."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sm120.core.errors import SM120Error
from sm120.plan.resolve import PlanRequest, resolve
from sm120.render.argv import render_argv
from sm120.render.compose import render_compose_service
from sm120.render.environment import render_env
from sm120.render.launcher import launcher_env
from tests.helpers import invoke

COMMAND = ["/usr/local/bin/lmcache-mp-wrapper.sh", "/usr/local/bin/serve-ds4-flash.sh"]


def _plan(*sets: str, variant: str = "r7"):  # type: ignore[no-untyped-def]
    return resolve(PlanRequest(recipe="dsv4", variants=(variant,), sets=sets))


def test_the_argv_is_the_launchers_command_whatever_the_interpreter() -> None:
    plan = _plan()
    assert render_argv(plan) == COMMAND
    assert render_argv(plan, python="/usr/bin/python3", bind_host="0.0.0.0") == COMMAND


def test_native_env_carries_the_knobs_the_flags_and_what_sm120_decides() -> None:
    env = render_env(_plan(), api_key="k")
    assert {key: env[key] for key in ("MODE", "BACKEND", "DSPARK_TOKENS", "NATIVE_L2_GB")} == {
        "MODE": "dspark",
        "BACKEND": "b12x-a16",
        "DSPARK_TOKENS": "5",
        "NATIVE_L2_GB": "0",
    }
    assert {key: env[key] for key in ("TP_SIZE", "DCP_SIZE", "MAX_MODEL_LEN", "LOAD_FORMAT")} == {
        "TP_SIZE": "2",
        "DCP_SIZE": "1",
        "MAX_MODEL_LEN": "131072",
        "LOAD_FORMAT": "instanttensor",
    }
    assert env["MODEL_PATH"] == "deepseek-ai/DeepSeek-V4-Flash-0731"
    assert env["MODEL_REVISION"] == "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"
    assert (env["HOST"], env["PORT"], env["SERVED_MODEL_NAME"]) == (
        "127.0.0.1",
        "8000",
        "DeepSeek-V4-Flash-0731",
    )
    assert env["VLLM_API_KEY"] == "k"  # vLLM reads it from the launcher's environment


def test_in_a_container_the_knobs_name_the_mounted_folder_and_all_addresses() -> None:
    env = launcher_env(_plan(), container_model_dir="/model", bind_host="0.0.0.0")
    assert (env["MODEL_PATH"], env["HOST"]) == ("/model", "0.0.0.0")
    assert "MODEL_REVISION" not in env  # a mounted folder is the revision


def test_the_4_gpu_route_differs_by_its_tensor_parallel_knob_only() -> None:
    two, four = launcher_env(_plan()), launcher_env(_plan(variant="r7-tp4"))
    assert {k: (two[k], four[k]) for k in two if two[k] != four[k]} == {"TP_SIZE": ("2", "4")}


def test_a_set_flag_a_knob_carries_reaches_the_launcher() -> None:
    assert launcher_env(_plan("max-model-len=65536"))["MAX_MODEL_LEN"] == "65536"


def test_a_set_flag_no_knob_carries_is_refused_not_dropped() -> None:
    with pytest.raises(SM120Error) as caught:
        _plan("attention-backend=B12X")
    assert caught.value.one_line() == (
        "attention-backend (command line) is decided by the image's launcher "
        "(/usr/local/bin/lmcache-mp-wrapper.sh /usr/local/bin/serve-ds4-flash.sh); no knob of "
        "it carries that flag (hint: flags a knob carries: decode-context-parallel-size, "
        "gpu-memory-utilization, load-format, max-model-len, max-num-batched-tokens, "
        "max-num-seqs, tensor-parallel-size)"
    )


def test_a_kv_tier_cannot_be_added_to_a_launcher_route() -> None:
    with pytest.raises(SM120Error) as caught:
        _plan("kv_tier.cpu_gib=32")
    assert caught.value.one_line() == (
        "a KV tier cannot be added to a route the image's own launcher runs "
        "(/usr/local/bin/lmcache-mp-wrapper.sh /usr/local/bin/serve-ds4-flash.sh) "
        "(hint: pick a variant whose command sm120 builds)"
    )


def test_plans_that_build_their_command_have_no_launcher_knobs() -> None:
    assert launcher_env(resolve(PlanRequest(recipe="dsv4"))) == {}


def test_compose_runs_the_launcher_and_probes_health_with_the_images_python() -> None:
    service = render_compose_service(_plan())
    assert [*service["entrypoint"], *service["command"]] == COMMAND
    assert service["healthcheck"]["test"][1] == "/opt/venv/bin/python"
    assert service["environment"]["HOST"] == "0.0.0.0"
    assert service["ports"] == ["127.0.0.1:8000:8000"]


def test_recipes_show_prints_the_knobs_and_where_their_expansion_stands(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "recipes", "show", "dsv4", "-V", "r7")
    assert code == 0, err
    text = " ".join(out.split())
    assert "command (the image's own launcher, run as is) " + " ".join(COMMAND) in text
    assert "BACKEND=b12x-a16 # b12x-a16: B12X W4A16 MoE, the row behind 236.46" in text
    assert "TP_SIZE=2 # from tensor-parallel-size" in text
    assert "expansion not public: the image installs serve-ds4-flash.sh" in text
    assert "another checkpoint than the default's (deepseek-ai/DeepSeek-V4-Flash)" in text
