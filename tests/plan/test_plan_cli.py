"""`sm120 plan`: the JSON contract, every F08 / F24 path, and one-line errors for bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sm120.plan.fit.memory import evaluate
from sm120.plan.fit.recommend import nvfp4_flag
from tests.helpers import invoke, one_line_error

REQUIRED = (
    "kv_bytes_per_token_per_rank",
    "kv_pool_tokens",
    "max_model_len_fit",
    "concurrency_at_max_len",
    "weights_gib_per_gpu",
)


def plan_json(cli: CliRunner, *args: str, expect: int = 0) -> dict[str, Any]:
    code, out, err = invoke(cli, "plan", *args, "--json")
    assert code == expect, err
    data: dict[str, Any] = json.loads(out)
    return data


def test_json_has_the_promised_fields(cli: CliRunner) -> None:
    # seed-pinned: glm47's former default, which leaves max-model-len to the model
    data = plan_json(cli, "glm47", "-V", "seed-pinned", "--gpus", "4", "--kv-memory-gib", "31.99")
    assert all(isinstance(data[key], int | float) for key in REQUIRED)
    assert data["kv_memory_source"] == "given"
    assert data["recommendation"] == {
        "tp": 4,
        "dcp": 1,
        "max_model_len": 202752,
        "reason": "the planned layout fits 202,752 tokens (3.60x concurrency)",
    }


def test_estimate_subtracts_weights_and_the_documented_overhead(cli: CliRunner) -> None:
    data = plan_json(cli, "glm52", "--gpus", "4", "--gpu-mem-gib", "94.97")
    assert data["kv_memory_source"] == "estimated"
    assert data["activation_overhead_gib"] == 1.5
    # 94.97 x 0.95 - 314.4 / 4 - 1.5
    assert data["kv_memory_gib_per_gpu"] == pytest.approx(94.97 * 0.95 - 78.6 - 1.5, abs=1e-3)
    assert data["weights_gib_per_gpu"] == 78.6


def test_f08_long_context_recommends_the_smallest_dcp_that_fits(cli: CliRunner) -> None:
    data = plan_json(
        cli, "glm52", "-V", "dcp1", "--gpus", "4", "--kv-memory-gib", "10.3",
        "--max-model-len", "250000", expect=1,
    )  # fmt: skip
    assert data["flags"] == [
        {
            "id": "F08",
            "severity": "error",
            "message": "max-model-len 250,000 needs 14.50 GiB of KV per GPU for one request "
            "but 10.30 GiB is free: the longest context that fits is 177,600",
            "fix": "set --decode-context-parallel-size 2",
        }
    ]
    assert (data["recommendation"]["tp"], data["recommendation"]["dcp"]) == (4, 2)


def test_f08_without_dcp_recommends_a_shorter_context(cli: CliRunner) -> None:
    # GLM-4.7 has 8 KV heads over TP 4: nothing to shard with DCP
    data = plan_json(
        cli, "glm47", "-V", "seed-pinned", "--gpus", "4", "--kv-memory-gib", "4", expect=1
    )
    assert data["flags"][0]["message"] == (
        "max-model-len 202,752 needs 8.89 GiB of KV per GPU for one request but 4.00 GiB is "
        "free: the longest context that fits is 91,168"
    )
    assert data["flags"][0]["fix"] == "set --max-model-len 91136"
    assert [(a["tp"], a["dcp"]) for a in data["alternatives"]] == [(4, 1)]


def test_f08_recommends_more_tensor_parallelism_when_gpus_allow(cli: CliRunner) -> None:
    data = plan_json(
        cli, "dsv4", "--gpus", "4", "--gpu-mem-gib", "80", "--max-model-len", "1048576",
        expect=1,
    )  # fmt: skip
    assert data["flags"][0]["fix"] == "set --tensor-parallel-size 4"
    assert data["recommendation"]["tp"] == 4


def test_f08_when_the_weights_leave_no_room(cli: CliRunner) -> None:
    data = plan_json(cli, "glm52", "--gpus", "4", "--gpu-mem-gib", "80", expect=1)
    assert data["flags"] == [
        {
            "id": "F08",
            "severity": "error",
            "message": "weights need 78.6 GiB per GPU but gpu-memory-utilization 0.95 leaves "
            "76.0 GiB (1.5 GiB of it for activations): no room for KV",
            "fix": "use more or larger GPUs, or a smaller checkpoint",
        }
    ]
    assert data["kv_pool_tokens"] == 0


def test_f24_shows_what_nvfp4_costs_against_mxfp4(cli: CliRunner) -> None:
    data = plan_json(cli, "dsv4", "-V", "nvfp4", "--gpus", "2", "--kv-memory-gib", "10")
    assert data["flags"] == [
        {
            "id": "F24",
            "severity": "warn",
            "message": "NVFP4 weights take 4.0 GiB/GPU more than MXFP4: a 607,621-token KV "
            "pool instead of 850,717 (4.64x instead of 6.49x concurrency at 131,072)",
            "fix": "use the MXFP4 checkpoint (the default, or --variant mxfp4)",
        }
    ]


def test_f24_without_a_known_mxfp4_size(cli: CliRunner) -> None:
    from sm120.plan.fit.dims import load_dims
    from sm120.plan.fit.memory import build_spec
    from sm120.plan.resolve import PlanRequest, resolve

    plan = resolve(PlanRequest("dsv4", ("nvfp4",)))
    dims = load_dims(plan.model.dims, plan.model.weights_gib, None)
    spec = build_spec(plan, dims, 2, None, 10.0, None)
    flag = nvfp4_flag(spec, evaluate(spec, 2, 1), mxfp4_gib=None)
    assert flag is not None and flag.message == (
        "NVFP4 weights are ~4 GiB/GPU larger than MXFP4 on SM12x"
    )
    mxfp4 = dataclasses.replace(spec, quantization="mxfp4")
    assert nvfp4_flag(mxfp4, evaluate(mxfp4, 2, 1), mxfp4_gib=148) is None


def test_human_output_is_a_table_with_flags_and_recommendation(cli: CliRunner) -> None:
    code, out, _ = invoke(
        cli, "plan", "glm52", "-V", "dcp1", "--gpus", "4", "--kv-memory-gib", "10.3",
        "--max-model-len", "250000",
    )  # fmt: skip
    assert code == 1
    for text in ("KV pool", "177,565 tokens", "F08", "recommendation", "layouts"):
        assert text in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("glm52", "--gpus", "0"),
            "Error: --gpus must be 1 or more, got 0 (hint: e.g. --gpus 4)",
        ),
        (
            ("glm52", "-V", "dcp3", "--gpus", "4"),
            "Error: recipe 'glm52' has no variant 'dcp3'; did you mean 'dcp4'? "
            "(hint: variants: seed, dcp4, dcp2, dcp1, gb10x6-ray, no-think, exl3-tp4, "
            "nvfp4-tp8)",
        ),
        (
            ("glm47", "--gpus", "2"),
            "Error: the plan uses tensor-parallel-size 4 but --gpus is 2 "
            "(hint: pass --gpus 4, or pick a variant for fewer GPUs)",
        ),
        (
            ("tiny", "--gpus", "1"),
            "Error: GPU memory is unknown: the recipe names none "
            "(hint: pass --gpu-mem-gib, e.g. 94.97, or --kv-memory-gib)",
        ),
        (
            ("glm47", "--gpus", "4", "--kv-memory-gib", "-1"),
            "Error: --kv-memory-gib must be more than 0, got -1 "
            "(hint: take it from the engine's 'Available KV cache memory' line)",
        ),
        (
            ("glm47", "--gpus", "4", "--gpu-mem-gib", "0"),
            "Error: --gpu-mem-gib must be more than 0, got 0 (hint: an RTX PRO 6000 has 94.97 GiB)",
        ),
        (
            ("glm52", "--gpus", "4", "--max-model-len", "0"),
            "Error: --max-model-len must be 1 or more, got 0 (hint: e.g. 131072)",
        ),
        (
            ("glm52", "--gpus", "4", "--set", "decode-context-parallel-size=3"),
            "Error: tensor-parallel-size 4 is not divisible by decode-context-parallel-size 3 "
            "(hint: pick a DCP that divides TP (1, 2 or 4 for TP 4))",
        ),
        (
            ("dsv4", "--gpus", "2", "--set", "decode-context-parallel-size=2"),
            "Error: DeepSeek-V4 cannot use decode-context-parallel-size > 1: its "
            "sliding-window caches are not sharded (hint: set decode-context-parallel-size 1)",
        ),
        (
            ("glm52", "--gpus", "4", "--set", "kv-cache-dtype=int8_per_token_head"),
            "Error: kv-cache-dtype 'int8_per_token_head' is not one the planner models "
            "(hint: use auto, bfloat16, fp8 or fp8_e4m3)",
        ),
        (
            ("glm47", "--gpus", "4", "--set", "tensor-parallel-size=3"),
            "Error: tensor-parallel-size 3 does not fit the model's 8 KV heads "
            "(hint: use a TP that divides 8 or a multiple of it)",
        ),
    ],
)
def test_bad_input_is_one_line(cli: CliRunner, args: tuple[str, ...], message: str) -> None:
    code, _, err = invoke(cli, "plan", *args)
    assert code == 2
    assert one_line_error(err) == message


def test_bad_config_json_is_one_line(cli: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = invoke(cli, "plan", "glm47", "--gpus", "4", "--model-dir", str(tmp_path))
    assert code == 2
    assert one_line_error(err) == (
        f"Error: {tmp_path}/config.json is not readable JSON: Expecting property name enclosed "
        "in double quotes: line 1 column 2 (char 1) (hint: re-download the checkpoint)"
    )


def test_model_dir_that_does_not_exist(cli: CliRunner, tmp_path: Path) -> None:
    code, _, err = invoke(
        cli, "plan", "glm47", "--gpus", "4", "--model-dir", str(tmp_path / "nowhere")
    )
    assert code == 2
    assert one_line_error(err) == (
        f"Error: --model-dir {tmp_path}/nowhere is not a folder "
        "(hint: pass the checkpoint folder that holds config.json)"
    )


def test_config_json_that_is_not_an_object(cli: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[1, 2]")
    code, _, err = invoke(cli, "plan", "glm47", "--gpus", "4", "--model-dir", str(tmp_path))
    assert code == 2
    assert one_line_error(err) == (
        f"Error: {tmp_path}/config.json is not a JSON object (hint: re-download the checkpoint)"
    )
