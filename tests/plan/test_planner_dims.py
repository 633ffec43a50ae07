"""Model dimensions from a checkpoint folder: config.json, its quantization config, the
weight files; the recipe's model.dims when there is no checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sm120.core.errors import PlanError
from sm120.plan.fit.dims import load_dims
from sm120.recipe.loader import load_recipe
from tests.helpers import invoke

# The public GLM-4.7 config.json fields the planner reads (3P transcriptions, vllm_facts 2.2).
GLM47_CONFIG = {
    "architectures": ["Glm4MoeForCausalLM"],
    "num_hidden_layers": 92,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 5120,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 202752,
    "torch_dtype": "bfloat16",
}
MODELOPT_FP8_KV = {"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}


def checkpoint(path: Path, config: dict[str, Any], **extra: Any) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    for name, content in extra.items():
        target = path / name.replace("__", ".")
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(json.dumps(content))
    return path


def glm47_recipe_dims() -> tuple[Any, float | None]:
    model = load_recipe("glm47").model
    return model.dims, model.weights_gib


def test_config_json_wins_and_hf_quant_config_makes_the_kv_cache_fp8(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path / "ckpt", GLM47_CONFIG, hf_quant_config__json=MODELOPT_FP8_KV)
    dims = load_dims(*glm47_recipe_dims(), str(folder))
    assert dims.source == f"{folder}/config.json"
    assert dims.dims.kv_cache_fp8 is True
    assert dims.dims.block_size == 16  # engine fields still come from the recipe


def test_without_a_quant_config_the_kv_cache_is_the_activation_dtype(
    tmp_path: Path, cli: CliRunner
) -> None:
    folder = checkpoint(tmp_path / "ckpt", GLM47_CONFIG)
    code, out, err = invoke(
        cli, "plan", "glm47", "--gpus", "4", "--kv-memory-gib", "31.99",
        "--model-dir", str(folder), "--json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["kv_cache_dtype"] == "bfloat16"
    assert data["kv_bytes_per_token_per_rank"] == 94_208  # twice the fp8 checkpoint's
    assert data["dims_source"] == f"{folder}/config.json"


@pytest.mark.parametrize(
    "quantization_config",
    [
        {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"},
        {"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float"}},
    ],
)
def test_quantization_config_in_config_json_makes_the_kv_cache_fp8(
    tmp_path: Path, quantization_config: dict[str, Any]
) -> None:
    config = {**GLM47_CONFIG, "quantization_config": quantization_config}
    dims = load_dims(*glm47_recipe_dims(), str(checkpoint(tmp_path / "c", config)))
    assert dims.dims.kv_cache_fp8 is True


def test_multimodal_configs_nest_the_language_model(tmp_path: Path) -> None:
    config = {"architectures": ["X"], "text_config": {**GLM47_CONFIG, "head_dim": 64}}
    dims = load_dims(*glm47_recipe_dims(), str(checkpoint(tmp_path / "c", config)))
    assert (dims.dims.num_hidden_layers, dims.dims.head_dim) == (92, 64)


def test_head_dim_and_kv_heads_default_like_transformers(tmp_path: Path) -> None:
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 256,
        "max_position_embeddings": 4096,
    }
    dims = load_dims(None, None, str(checkpoint(tmp_path / "c", config))).dims
    assert (dims.head_dim, dims.num_key_value_heads) == (64, 4)


def test_weight_files_give_the_resident_size(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path / "c", GLM47_CONFIG, model__safetensors=b"\0" * 3 * 1024**2)
    dims = load_dims(*glm47_recipe_dims(), str(folder))
    assert dims.weights_gib == pytest.approx(3 / 1024)
    assert dims.weights_source == f"weight files in {folder}"


def test_dsa_full_layers_come_from_indexer_types(tmp_path: Path) -> None:
    pattern = (
        ["full", "full", "full"] + ["shared", "shared", "shared", "full"] * 18 + ["shared"] * 3
    )
    config = {
        "num_hidden_layers": 78,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "index_head_dim": 128,
        "max_position_embeddings": 202752,
        "indexer_types": pattern,
    }
    model = load_recipe("glm52").model
    dims = load_dims(model.dims, model.weights_gib, str(checkpoint(tmp_path / "c", config)))
    assert dims.indexer_full_layers == 21
    assert dims.dims.dsa_indexer_cache == "every_layer"


def test_recipe_dims_when_there_is_no_checkpoint(tmp_path: Path) -> None:
    dims = load_dims(*glm47_recipe_dims(), str(tmp_path / "absent"))
    assert dims.source == "recipe model.dims"
    assert dims.weights_gib == 188.44


def test_no_dims_anywhere(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as caught:
        load_dims(None, None, str(tmp_path))
    assert caught.value.one_line() == (
        f"no model dimensions: the recipe has no model.dims and there is no "
        f"{tmp_path}/config.json (hint: pass --model-dir with the checkpoint, or add "
        "model.dims to the recipe)"
    )


def test_config_without_layers(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path / "c", {"num_attention_heads": 4})
    with pytest.raises(PlanError) as caught:
        load_dims(None, None, str(folder))
    assert caught.value.one_line() == (
        f"{folder}/config.json has no positive num_hidden_layers (hint: point --model-dir at "
        "the checkpoint folder that holds the model's config.json)"
    )


def test_config_with_a_bad_field(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path / "c", {**GLM47_CONFIG, "head_dim": -1})
    with pytest.raises(PlanError) as caught:
        load_dims(None, None, str(folder))
    assert caught.value.one_line() == (
        f"{folder}/config.json: head_dim: Input should be greater than 0 (hint: point "
        "--model-dir at the checkpoint folder that holds the model's config.json)"
    )


def test_unreadable_hf_quant_config(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path / "c", GLM47_CONFIG)
    (folder / "hf_quant_config.json").write_text("{")
    with pytest.raises(PlanError, match=r"hf_quant_config\.json is not readable JSON"):
        load_dims(None, None, str(folder))


def test_no_dims_and_no_checkpoint_folder_reads_as_english() -> None:
    with pytest.raises(PlanError) as caught:
        load_dims(None, None, None)
    assert caught.value.one_line() == (
        "no model dimensions: the recipe has no model.dims and no checkpoint folder "
        "(--model-dir) with a config.json was given (hint: pass --model-dir with the "
        "checkpoint, or add model.dims to the recipe)"
    )
