"""One resolution order: recipe < variant < .env < environment < command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120.core.dotenv import read_dotenv
from sm120.core.errors import PlanError
from sm120.render.argv import render_argv
from tests.helpers import REPO, flag_value, plan_for


def max_len(variants: tuple[str, ...] = (), **kwargs: object) -> tuple[str | None, str]:
    plan = plan_for("glm52", *variants, **kwargs).plan  # type: ignore[arg-type]
    return flag_value(render_argv(plan), "--max-model-len"), plan.provenance["args.max-model-len"]


def test_recipe_default() -> None:
    assert max_len() == ("131072", "recipe")


def test_variant_beats_recipe() -> None:
    assert max_len(variants=("dcp2",)) == ("250000", "variant dcp2")


def test_dotenv_beats_variant() -> None:
    assert max_len(variants=("dcp1",), dotenv={"MAX_MODEL_LEN": "100000"}) == ("100000", ".env")


def test_environment_beats_dotenv() -> None:
    assert max_len(
        dotenv={"MAX_MODEL_LEN": "100000"}, environ={"SM120_MAX_MODEL_LEN": "90000"}
    ) == ("90000", "environment")


def test_command_line_beats_environment() -> None:
    assert max_len(environ={"SM120_MAX_MODEL_LEN": "90000"}, sets=("max-model-len=80000",)) == (
        "80000",
        "command line",
    )


def test_unprefixed_environment_is_ignored_except_model_dir(tmp_path: Path) -> None:
    plan = plan_for(
        "glm52", environ={"MAX_MODEL_LEN": "5", "PORT": "9", "MODEL_DIR": str(tmp_path)}
    ).plan
    assert plan.arg("max-model-len") == 131072
    assert plan.port == 8000
    assert plan.model_dir == str(tmp_path)


def test_variant_selected_from_dotenv_and_cli_wins() -> None:
    assert plan_for("glm52", dotenv={"VARIANT": "dcp2"}).plan.variants == ("dcp2",)
    chosen = plan_for("glm52", "dcp1", dotenv={"VARIANT": "dcp2"}).plan.variants
    assert chosen == ("dcp1",)


def test_enable_thinking_zero_applies_the_no_think_variant() -> None:
    plan = plan_for("glm52", dotenv={"ENABLE_THINKING": "0"}).plan
    assert plan.variants == ("no-think",)
    assert plan.arg("reasoning-parser") is None
    assert "--reasoning-parser" not in render_argv(plan)


def test_thinking_off_is_a_no_op_where_thinking_is_already_off() -> None:
    assert plan_for("glm47", thinking=False).plan.variants == ()


def test_thinking_toggle_on_a_recipe_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (REPO / "recipes" / "tiny.yaml").read_text()
    (tmp_path / "tiny.yaml").write_text(source.replace("thinking: false", "thinking: true"))
    monkeypatch.setenv("SM120_RECIPES_DIR", str(tmp_path))
    with pytest.raises(PlanError, match="recipe 'tiny' has no thinking-off variant"):
        plan_for("tiny", thinking=False)


def test_set_recipe_keys_and_env() -> None:
    plan = plan_for(
        "glm52", sets=("model.served_name=glm", "env.NCCL_P2P_DISABLE=0", "thinking=false")
    ).plan
    assert plan.model.served_name == "glm"
    assert plan.env_dict["NCCL_P2P_DISABLE"] == "0"
    assert plan.thinking is False


def test_set_json_value_and_null_removes() -> None:
    plan = plan_for(
        "glm52",
        sets=(
            'speculative-config={"method":"mtp","num_speculative_tokens":1}',
            "reasoning-parser=null",
        ),
    ).plan
    assert plan.arg("speculative-config") == {"method": "mtp", "num_speculative_tokens": 1}
    assert "--reasoning-parser" not in render_argv(plan)


def test_cli_host_port_and_secure_default() -> None:
    assert plan_for("glm47").plan.host == "127.0.0.1"
    plan = plan_for("glm47", host="0.0.0.0", port=9001).plan
    argv = render_argv(plan)
    assert (flag_value(argv, "--host"), flag_value(argv, "--port")) == ("0.0.0.0", "9001")


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("max-model-len",), "--set 'max-model-len' is not KEY=VALUE"),
        (("max-model-len=lots",), "max-model-len expects a int value, got 'lots'"),
        (("kv-cache-dtyp=fp8",), "did you mean 'kv-cache-dtype'?"),
        (
            ("model.servedname=x",),
            "unknown recipe key 'model.servedname'; did you mean 'model.served_name'?",
        ),
        (
            ("model.dims.block_sise=32",),
            "unknown recipe key 'model.dims.block_sise'; did you mean 'model.dims.block_size'?",
        ),
        (
            ("model.served_name.x=1",),
            "unknown recipe key 'model.served_name.x': 'model.served_name' has no keys below it",
        ),
        (("model.dims.dsa_indexer_cache=sometimes",), "model.dims.dsa_indexer_cache: Input"),
        (("port=1",), "'port' is set by sm120 itself"),
        (("hf-overrides={oops",), "hf-overrides"),
    ],
)
def test_bad_set(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(PlanError) as info:
        plan_for("glm52", sets=sets)
    assert message in info.value.message


def test_set_reaches_into_nested_recipe_models() -> None:
    """`model.dims.X` changes one field of the dims and keeps the others."""
    plan = plan_for("glm52", sets=("model.dims.dsa_indexer_cache=full_layers",)).plan
    assert plan.model.dims is not None
    assert plan.model.dims.dsa_indexer_cache == "full_layers"
    assert plan.model.dims.kv_lora_rank == 512


def test_unknown_variant() -> None:
    with pytest.raises(PlanError, match="has no variant 'dcp3'; did you mean 'dcp4'"):
        plan_for("glm52", "dcp3")


def test_plan_hash_is_stable_and_sensitive() -> None:
    first = plan_for("glm52").plan.plan_hash
    assert plan_for("glm52").plan.plan_hash == first
    assert plan_for("glm52", port=9000).plan.plan_hash != first
    assert plan_for("glm52", "dcp2").plan.plan_hash != first


def test_plan_is_immutable() -> None:
    plan = plan_for("glm52").plan
    with pytest.raises(AttributeError):
        plan.port = 1  # type: ignore[misc]


def test_dotenv_parsing(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text("# comment\nexport PORT=8001\nMODEL_DIR='/m/x'\nDCP_SIZE=2 # half\n\n")
    assert read_dotenv(path) == {"PORT": "8001", "MODEL_DIR": "/m/x", "DCP_SIZE": "2"}


def test_dotenv_bad_line(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text("PORT 8001\n")
    with pytest.raises(PlanError, match=r"\.env:1: expected KEY=VALUE"):
        read_dotenv(path)
