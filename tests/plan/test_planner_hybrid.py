"""Hybrid linear-attention layouts (plan/fit/hybrid.py) and DeepSeek-V4.1's (plan/fit/dsv41.py):
the arithmetic, the configs they are keyed on, and the GPU run's engine logs replayed."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.core.errors import PlanError
from sm120.plan.fit.dims import known_dims, load_dims
from sm120.plan.fit.hybrid import HybridShape, hybrid, mamba_mode, state_bytes
from sm120.recipe.loader import load_recipe
from sm120.recipe.schema import ModelDims
from tests.helpers import DATA_DIR, REPO, invoke, one_line_error

sys.path.insert(0, str(REPO / "benchmarks"))

import hybrid_proof
from reduced_models import write_reduced

CONFIGS = DATA_DIR / "model_configs"
PROOF = REPO / "benchmarks" / "results" / "gpu-proof-hybrid.json"
KV_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
CONCURRENCY_LINE = re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x")


def _dims(**fields: object) -> ModelDims:
    return ModelDims.model_validate(
        {"num_hidden_layers": 8, "max_position_embeddings": 4096, **fields}
    )


GDN = {
    "linear_attention": "gdn",
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}


def test_gdn_state_is_the_conv_window_and_the_recurrent_matrix() -> None:
    # conv: (2 x 16 x 128 + 32 x 128) channels x (4 - 1) taps x 2 B; state: 32 x 128 x 128 x 2 B
    assert state_bytes(_dims(**GDN), tp=1, spec_tokens=0, ssm_dtype=None) == 49_152 + 1_048_576
    # a draft token widens the conv window; TP 2 halves both
    assert state_bytes(_dims(**GDN), tp=2, spec_tokens=2, ssm_dtype=None) == 40_960 + 524_288
    # the config's mamba_ssm_dtype (Qwen3.8-Flash-Next: float32) doubles the matrix
    fp32 = _dims(**GDN, mamba_ssm_dtype="float32")
    assert state_bytes(fp32, tp=1, spec_tokens=0, ssm_dtype=None) == 49_152 + 2_097_152
    assert state_bytes(fp32, tp=1, spec_tokens=0, ssm_dtype="bfloat16") == 49_152 + 1_048_576


def test_kda_state_keeps_fp32_and_no_room_for_draft_tokens() -> None:
    kda = _dims(**{**GDN, "linear_attention": "kda", "linear_num_key_heads": 32})
    # conv: 3 x 32 x 128 channels x 3 taps x 2 B; recurrent 32 x 128 x 128 x 4 B
    assert state_bytes(kda, tp=1, spec_tokens=3, ssm_dtype=None) == 73_728 + 2_097_152
    # Kimi-K3's 96 heads at TP 9: a rank holds the ceiling, 11 heads
    k3 = _dims(**{**GDN, "linear_attention": "kda", "linear_num_key_heads": 96,
                  "linear_num_value_heads": 96})  # fmt: skip
    # conv 3 x 96 x 128 = 36,864 channels, 4,096 a rank; recurrent 11 x 128 x 128 x 4 B
    assert state_bytes(k3, tp=9, spec_tokens=0, ssm_dtype=None) == 4096 * 3 * 2 + 720_896


def test_block_grows_until_a_page_holds_a_state_and_groups_follow_the_smaller_count() -> None:
    shape = HybridShape(
        attention_layers=2, token_bytes=2048, linear_layers=6, state_bytes=1_097_728,
        kernel_block=16, summary="K,V",
    )  # fmt: skip
    layout = hybrid(shape, block_size=16, mode="none", spec_tokens=0, dcp=1)
    assert layout.block_size == 544  # 16 x cdiv(1,097,728, 16 x 2,048)
    assert layout.bytes_per_block == 2 * 544 * 2048  # two layers a group
    assert layout.blocks_per_request(32768) == 61 + 3  # one attention table, three state groups
    aligned = hybrid(shape, block_size=16, mode="align", spec_tokens=2, dcp=1)
    assert aligned.blocks_per_request(32768) == 61 + 3 * (2 + 2)


def test_group_size_is_the_larger_count_when_it_is_under_one_and_a_half_times_the_smaller() -> None:
    shape = HybridShape(13, 1024, 12, 100_000, 16, "K,V")
    layout = hybrid(shape, block_size=16, mode="none", spec_tokens=0, dcp=1)
    assert layout.bytes_per_block == 13 * layout.block_size * 1024
    assert layout.blocks_per_request(1000) == -(-1000 // layout.block_size) + 1


def test_prefix_caching_chooses_align_and_nothing_else_is_known() -> None:
    assert mamba_mode(False, "align") == "none"  # vLLM turns it off without prefix caching
    assert mamba_mode(True, None) == "align"
    assert mamba_mode(True, "all") == "align"  # neither GDN nor KDA models support 'all'
    with pytest.raises(PlanError) as raised:
        mamba_mode(True, "some")
    assert raised.value.message == "mamba-cache-mode 'some' is not one vLLM knows"
    assert raised.value.hint == "use none, align or all"


def test_a_hybrid_recipe_without_a_recurrent_count_is_refused(cli: CliRunner) -> None:
    code, _, err = invoke(
        cli, "plan", "qwen38flash", "--gpus", "1", "--set", "model.dims.linear_layers=null",
    )  # fmt: skip
    assert code == 2
    assert one_line_error(err) == (
        "Error: model.dims.linear_layers must count the recurrent layers, fewer than "
        "num_hidden_layers (hint: pass --model-dir with the checkpoint's config.json "
        "(layer_types / kda_layers))"
    )


def test_a_bad_mamba_cache_mode_is_refused_in_one_line(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "plan", "qwen38flash", "--gpus", "1", "--set",
                          "mamba-cache-mode=sometimes")  # fmt: skip
    assert code == 2
    assert one_line_error(err) == (
        "Error: mamba-cache-mode 'sometimes' is not one vLLM knows (hint: use none, align or all)"
    )


@pytest.mark.parametrize(
    ("config", "kind", "linear", "extra"),
    [
        ("qwen3.8-flash-next.json", "gdn", 36, {"mamba_ssm_dtype": "float32",
                                                 "index_compress_ratio": 4,
                                                 "num_nextn_predict_layers": 1}),
        ("qwen3-next-80b-a3b.json", "gdn", 36, {"linear_num_value_heads": 32}),
        ("kimi-linear-48b-a3b.json", "kda", 20, {"linear_num_value_heads": 32}),
        ("kimi-k3.json", "kda", 69, {"linear_num_value_heads": 96, "kv_lora_rank": 512}),
        ("glm-5.3-flash.json", "kda", 34, {"qk_rope_head_dim": 0, "index_compress_ratio": 4}),
    ],
)  # fmt: skip
def test_configs_give_the_recurrent_layers(
    tmp_path: Path, config: str, kind: str, linear: int, extra: dict[str, object]
) -> None:
    shutil.copy(CONFIGS / config, tmp_path / "config.json")
    dims = load_dims(None, None, str(tmp_path)).dims
    assert dims.linear_attention == kind
    assert dims.linear_layers == linear
    for field, value in extra.items():
        assert getattr(dims, field) == value


def test_dsv41_config_gives_its_source_layers(tmp_path: Path) -> None:
    shutil.copy(CONFIGS / "deepseek-v4.1-flash.json", tmp_path / "config.json")
    dims = load_dims(None, None, str(tmp_path)).dims
    assert dims.kv_source_layer_ids == (2, 8, 14, 20)
    assert dims.index_source_layer_ids == (2, 8, 14, 20, 24, 28, 32, 36)
    assert dims.compress_ratios is not None and len(dims.compress_ratios) == 43


@pytest.mark.parametrize(
    ("recipe", "config"),
    [
        ("qwen38flash", "qwen3.8-flash-next.json"),
        ("glm53flash", "glm-5.3-flash.json"),
        ("dsv41", "deepseek-v4.1-flash.json"),
    ],
)
def test_recipe_dims_plan_as_the_checkpoint_config_does(
    recipe: str, config: str, tmp_path: Path, cli: CliRunner
) -> None:
    shutil.copy(CONFIGS / config, tmp_path / "config.json")
    gpus = str(load_recipe(recipe).hardware.gpus)
    common = ("plan", recipe, "--gpus", gpus, "--kv-memory-gib", "20", "--json")
    code, from_recipe, err = invoke(cli, *common)
    assert code == 0, err
    code, from_config, err = invoke(cli, *common, "--model-dir", str(tmp_path))
    assert code == 0, err
    assert json.loads(from_recipe)["kv_pool_tokens"] == json.loads(from_config)["kv_pool_tokens"]


def test_dsv41_counts_its_sources_and_every_layers_window(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "plan", "dsv41", "--gpus", "4", "--kv-memory-gib", "20", "--json")
    assert code == 0, err
    layout = json.loads(out)["kv_layout"]
    # a 256-token block: 3 sources at ratio 2 and one at ratio 1 store 640 tokens x 584 B; the
    # index sources 3 x 128 + 5 x 256 keys x 132 B
    assert f"({640 * 584 + (3 * 128 + 5 * 256) * 132:,} B per 256-token block)" in layout
    assert "40 sliding-window rings of 128 tokens in 128-token pages" in layout


def test_qwen38flash_plans_its_own_8_gib_pool_without_a_weight_size(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "plan", "qwen38flash", "--gpus", "1", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["kv_memory_source"] == "kv-cache-memory-bytes"
    assert document["kv_memory_gib_per_gpu"] == 8.0


def _proof_rows() -> list[dict[str, object]]:
    return list(json.loads(PROOF.read_text())["rows"])


@pytest.mark.parametrize("row", _proof_rows(), ids=lambda row: str(row["case"]))
def test_the_gpu_runs_engine_logs_are_planned_to_the_token(
    row: dict[str, object], tmp_path: Path, cli: CliRunner
) -> None:
    case = next(c for c in hybrid_proof.CASES if c["label"] == row["case"])
    engine_log = (DATA_DIR / "gpu_proof" / f"hybrid-{row['case']}.log").read_text()
    printed = KV_LINE.search(engine_log)
    assert printed is not None
    model = write_reduced(case["model"], tmp_path / "model")
    code, out, err = invoke(cli, *hybrid_proof.plan_argv(case, model))
    assert code == 0, err
    planned = json.loads(out)
    assert planned["kv_pool_tokens"] == int(printed[1].replace(",", ""))
    concurrency = CONCURRENCY_LINE.search(engine_log)
    assert concurrency is not None
    assert f"{planned['concurrency_at_max_len']:.2f}" == concurrency[1]
    assert row["plan_tokens"] == row["vllm_tokens"]


def test_known_kimi_k3_dims_are_its_configs(tmp_path: Path) -> None:
    shutil.copy(CONFIGS / "kimi-k3.json", tmp_path / "config.json")
    from_config = load_dims(None, None, str(tmp_path)).dims
    known = known_dims("lukealonso/Kimi-K3-QSRT-K2", "KimiK3ForConditionalGeneration")
    assert known is not None
    for field in ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "linear_attention",
                  "linear_layers", "linear_num_value_heads", "linear_value_head_dim",
                  "linear_conv_kernel_dim", "max_position_embeddings"):  # fmt: skip
        assert getattr(known, field) == getattr(from_config, field), field
    # another architecture under the same repo name is not guessed
    assert known_dims("lukealonso/Kimi-K3-QSRT-K2", "KimiLinearForCausalLM") is None


def test_known_vision_exp_dims_are_deepseek_v4_flash_text_model() -> None:
    known = known_dims("deepseek-ai/DeepSeek-V4-Flash-Vision-Exp", "DeepseekV4ForCausalLM")
    flash = load_recipe("dsv4").model.dims
    assert known is not None and flash is not None
    kv_fields = (
        "num_hidden_layers", "head_dim", "qk_rope_head_dim", "index_head_dim", "compress_ratios",
        "sliding_window", "num_nextn_predict_layers", "block_size",
    )  # fmt: skip
    assert all(getattr(known, f) == getattr(flash, f) for f in kv_fields)


def test_a_recipe_naming_a_known_checkpoint_needs_no_dims(cli: CliRunner) -> None:
    code, out, err = invoke(
        cli, "plan", "glm53flash", "--gpus", "9", "--kv-memory-gib", "20", "--json",
        "--set", "model.repo=lukealonso/Kimi-K3-QSRT-K2",
        "--set", "model.architecture=KimiK3ForConditionalGeneration",
        "--set", "model.attention=kda_mla_hybrid", "--set", "model.dims=null",
        "--set", "tensor-parallel-size=9", "--set", "decode-context-parallel-size=9",
    )  # fmt: skip
    assert code == 0, err
    layout = json.loads(out)["kv_layout"]
    assert "24 attention layers (MLA latent 576 B/token on each) + 69 recurrent layers" in layout
    # 96 KDA heads over TP 9: 11 a rank (745,472 B of state); the recipe's 256-token blocks
    # grow to 1,536 tokens x 576 B
    assert "(745,472 B of state each, padded to the 884,736 B page); 1536-token blocks" in layout


def _bytes_per_token(cli: CliRunner, recipe: str, *sets: str) -> float:
    args = [arg for value in sets for arg in ("--set", value)]
    code, out, err = invoke(cli, "plan", recipe, "--gpus", "2", "--kv-memory-gib", "20",
                            "--max-model-len", "262144", "--json", *args)  # fmt: skip
    assert code == 0, err
    return float(json.loads(out)["kv_bytes_per_token_per_rank"])


def test_nvfp4_ds_mla_stores_360_bytes_where_fp8_ds_mla_stores_584(cli: CliRunner) -> None:
    # rtx6kpro models/ds4dspark-nvfp4-kv.md (TP 2, 262K, max-num-batched-tokens 2048):
    # 15.3 KB/token with fp8_ds_mla, 10.4 KB/token with nvfp4_ds_mla, "1.47x"
    common = ("max-num-batched-tokens=2048", "image.engine_version=DSpark fork")
    fp8 = _bytes_per_token(cli, "dsv4", "kv-cache-dtype=fp8", *common)
    nvfp4 = _bytes_per_token(cli, "dsv4", "kv-cache-dtype=nvfp4_ds_mla", *common)
    assert 2 * fp8 == pytest.approx(15.3e3, rel=0.02)
    assert 2 * nvfp4 == pytest.approx(10.4e3, rel=0.02)
    assert fp8 / nvfp4 == pytest.approx(1.47, rel=0.02)


def test_nvfp4_ds_mla_is_refused_outside_deepseek_v4(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "plan", "glm52", "--gpus", "4", "--kv-memory-gib", "20",
                          "--set", "kv-cache-dtype=nvfp4_ds_mla")  # fmt: skip
    assert code == 2
    assert one_line_error(err) == (
        "Error: kv-cache-dtype nvfp4_ds_mla is DeepSeek-V4's 4-bit layout, not one for "
        "attention 'mla_sparse_dsa' (hint: use fp8 (or nvfp4 on full attention))"
    )


def test_an_unknown_mamba_ssm_cache_dtype_is_refused_in_one_line(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "plan", "qwen38flash", "--gpus", "1", "--set",
                          "mamba-ssm-cache-dtype=fp6")  # fmt: skip
    assert code == 2
    assert one_line_error(err) == (
        "Error: mamba-ssm-cache-dtype 'fp6' is not one the planner models "
        "(hint: use auto, bfloat16, float16 or float32)"
    )
