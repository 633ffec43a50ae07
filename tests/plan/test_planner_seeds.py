"""The planner against what real users measured (shared/seeds): given the KV memory the
engine reported, it must reproduce the KV pool the engine then printed, within 1%."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.helpers import invoke


def plan_json(cli: CliRunner, *args: str, expect: int = 0) -> dict[str, Any]:
    code, out, err = invoke(cli, "plan", *args, "--json")
    assert code == expect, err
    data: dict[str, Any] = json.loads(out)
    return data


def within(value: float, expected: float, tolerance: float = 0.01) -> bool:
    return abs(value - expected) <= tolerance * expected


def test_glm47_tp4_seed_000(cli: CliRunner) -> None:
    # "Available KV cache memory: 31.99 GiB" -> "GPU KV cache size: 729,248 tokens". Only an
    # fp8 cache gives that: the NVFP4 checkpoint's quant config has kv_cache_quant_algo FP8.
    data = plan_json(cli, "glm47", "--gpus", "4", "--kv-memory-gib", "31.99")
    assert data["kv_bytes_per_token_per_rank"] == 47_104
    assert within(data["kv_pool_tokens"], 729_248)
    assert data["flags"] == []


def test_glm52_dcp4_seed_002(cli: CliRunner) -> None:
    # ~10.3 GB free per GPU, DCP 4 -> "710,593-token pool", "2.84x concurrency at 250k"
    data = plan_json(cli, "glm52", "-V", "seed", "--gpus", "4", "--kv-memory-gib", "10.3")
    assert (data["tp"], data["dcp"], data["max_model_len"]) == (4, 4, 250_000)
    assert within(data["kv_pool_tokens"], 710_593)
    assert within(data["concurrency_at_max_len"], 2.84)
    assert within(data["kv_bytes_per_token_per_rank"], 62_252 / 4)


def test_glm52_dcp1_seed_002_needs_14_5_gb_for_one_250k_request(cli: CliRunner) -> None:
    data = plan_json(
        cli, "glm52", "-V", "dcp1", "--gpus", "4", "--kv-memory-gib", "10.3",
        "--max-model-len", "250000", expect=1,
    )  # fmt: skip
    assert within(data["kv_gib_per_request_at_max_len"], 14.5)
    # the engine's own estimate in the F08 error: "estimated maximum model length is ~177728"
    assert within(data["max_model_len_fit"], 177_728)
    assert [flag["id"] for flag in data["flags"]] == ["F08"]


def test_glm52_dcp_table_seed_002(cli: CliRunner) -> None:
    # README table: DCP 2 ~355k tokens at 1.42x; DCP 1 ~178k tokens, 1.36x at 131,072
    dcp2 = plan_json(cli, "glm52", "-V", "dcp2", "--gpus", "4", "--kv-memory-gib", "10.3")
    assert within(dcp2["kv_pool_tokens"], 355_000)
    assert within(dcp2["concurrency_at_max_len"], 1.42)
    dcp1 = plan_json(cli, "glm52", "-V", "dcp1", "--gpus", "4", "--kv-memory-gib", "10.3")
    assert within(dcp1["kv_pool_tokens"], 178_000)
    assert within(dcp1["concurrency_at_max_len"], 1.36)


def dsv4_gb10(cli: CliRunner) -> dict[str, Any]:
    # Seed 001's 2x GB10 sweep: TP 2, max-model-len 1048576, MTP 2, fp8 KV, block 256. It
    # does not state max-num-batched-tokens; 4176 is the default of the PR author's DGX Spark
    # launcher (jasl/vllm-ds4-sm120-harness scripts/dgx_spark_start_mp_serve.sh).
    return plan_json(
        cli, "dsv4", "-V", "seed", "--gpus", "2", "--kv-memory-gib", "10.38",
        "--max-model-len", "1048576", "--set", "max-num-batched-tokens=4176",
    )  # fmt: skip


def test_dsv4_tp2_seed_001_within_3_percent(cli: CliRunner) -> None:
    # "KV cache = 1,868,754 tokens (5,964 bytes/token)"
    assert within(dsv4_gb10(cli)["kv_bytes_per_token_per_rank"], 5_964, tolerance=0.03)


@pytest.mark.xfail(
    strict=True,
    reason="the model of vLLM's mid-2026 DeepSeek-V4 packing gives 5,838 B/token (-2.1%); "
    "the exact allocator of the PR #41834 stable tag is not in any public copy we could read",
)
def test_dsv4_tp2_seed_001_within_1_percent(cli: CliRunner) -> None:
    assert within(dsv4_gb10(cli)["kv_bytes_per_token_per_rank"], 5_964)
