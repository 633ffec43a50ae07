"""DeepSeek-V4's KV cache as vLLM 0.26 packs it (planner/dsv4_packed.py), against what the
real CUDA vLLM 0.26.0 printed for the GPU proof's reduced model, and the recipe's own engine
(the PR-41834 fork), whose figures must not move."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sm120.core.errors import PlanError
from sm120.plan.fit import kv
from sm120.plan.fit.dsv4_packed import deepseek_v4_packed
from sm120.plan.fit.memory import packs_dsv4_upstream
from tests.helpers import BF16, DSV4, FP8, REPO, invoke

sys.path.insert(0, str(REPO / "benchmarks"))

import reduced_models

GIB = 1024**3
FORK = "sm120-pr-41834-stable-preview-20260626"  # dsv4 pr41834's image.engine_version


def plan_reduced(cli: CliRunner, tmp_path: Path, tp: int, *sets: str) -> dict[str, Any]:
    """`sm120 plan dsv4 -V pr41834` (the default the proof ran on) with the GPU proof's inputs:
    the reduced 8-layer checkpoint config, 4 GiB of KV per GPU, 32,768 tokens, 256-token
    blocks, fp8, 4,096 batched tokens."""
    model = reduced_models.write_reduced("dsv4", tmp_path / "dsv4")
    argv = ["plan", "dsv4", "-V", "pr41834", "--gpus", str(tp), "--kv-memory-gib", "4"]
    argv += ["--model-dir", str(model)]
    argv += ["--max-model-len", "32768", "--json"]
    settings = (
        f"tensor-parallel-size={tp}",
        "block-size=256",
        "kv-cache-dtype=fp8",
        "max-num-batched-tokens=4096",
        "speculative-config=null",
        *sets,
    )
    for setting in settings:
        argv += ["--set", setting]
    code, out, err = invoke(cli, *argv)
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_026_pool_for_the_gpu_proofs_dsv4_is_what_the_engine_printed(
    cli: CliRunner, tmp_path: Path, tp: int
) -> None:
    # tests/data/gpu_proof/planner-dsv4-fp8-tp{1,2}-dcp1.log: "GPU KV cache size: 307,212
    # tokens", "Maximum concurrency for 32,768 tokens per request: 9.38x" at TP 1 and TP 2.
    data = plan_reduced(cli, tmp_path, tp, "image.engine_version=0.26.0")
    assert data["engine"] == "0.26.0"
    assert data["kv_blocks"] == 4 * GIB // 143_424 == 29_945
    assert data["kv_pool_tokens"] == 307_212
    assert data["concurrency_at_max_len"] == 9.375
    assert "(vLLM 0.26 packing)" in data["kv_layout"]


@pytest.mark.parametrize("tp", [1, 2])
def test_the_recipes_fork_keeps_its_packing(cli: CliRunner, tmp_path: Path, tp: int) -> None:
    # What `sm120 plan` said before vLLM 0.26 was modelled (the GPU proof's plan_tokens for
    # these inputs, 2026-11-26): the fork draws whole blocks for every window cache.
    data = plan_reduced(cli, tmp_path, tp)
    assert data["engine"] == FORK
    assert data["kv_pool_tokens"] == 520_550
    assert data["kv_layout"] == (
        "3 C4 + 3 C128 compressed layers, 3 layer tuples per 256-token block (C4 latent "
        "37,440 B, C4 indexer 8,640 B, C128 latent 1,728 B); 8 sliding-window caches and the "
        "compressor states take window-bounded blocks per request"
    )


def test_reduced_layout_counts_window_pages_in_bytes() -> None:
    dims = DSV4.model_copy(
        update={"num_hidden_layers": 8, "compress_ratios": (0, 0, 4, 128, 4, 128, 4, 128, 0)}
    )
    layout = deepseek_v4_packed(dims, 1, FP8, 256, extra_layers=0, chunk=4096)
    assert (layout.bytes_per_block, layout.window_unit_bytes) == (143_424, 143_424)
    # 8 SWA caches in groups of 3, 3, 2; C4 attention state (32,832 B padded to 37,440) and
    # C4 indexer state (8,640 B) share a group; two batches of 4,096 tokens in flight.
    assert [(w.name, w.tables, w.window, w.block_size, w.page_bytes) for w in layout.windows] == [
        ("sliding window", 2, 128, 64, 3 * 37_440),
        ("sliding window", 1, 128, 64, 2 * 37_440),
        ("C4 compressor state", 1, 8, 4, 3 * (37_440 + 8_640)),
        ("C128 compressor state", 1, 128, 8, 3 * 37_440),
    ]
    assert layout.chunk_tokens == 8192
    swa, c4_state, c128_state = 131, 2051, 1041  # cdiv(min(w - 1 + 8192, 32768), b) + 1
    window_bytes = swa * 8 * 37_440 + c4_state * 3 * (37_440 + 8_640) + c128_state * 3 * 37_440
    assert layout.blocks_per_request(32_768) == 128 + -(-window_bytes // 143_424) == 3_194


def test_full_deepseek_v4_pads_the_pool_block_beyond_the_compressed_layers() -> None:
    # 21 C4 + 20 C128 layers and 44 SWA caches: 22 tuples; the SWA and state groups fill 22
    # slots of 37,440 B while the compressed layers own 21 / 21 / 20 pages.
    layout = deepseek_v4_packed(DSV4, 1, FP8, 256, extra_layers=1, chunk=4096)
    assert layout.bytes_per_block == 22 * 37_440 + 21 * 8_640 + 20 * 1_728
    assert layout.window_unit_bytes == 21 * 37_440 + 21 * 8_640 + 20 * 1_728
    assert [(w.name, w.tables, w.page_bytes) for w in layout.windows] == [
        ("sliding window", 2, 22 * 37_440),
        ("C4 compressor state", 1, 21 * (37_440 + 8_640)),
        ("C128 compressor state", 1, 20 * 37_440),
    ]
    assert layout.summary.startswith(
        "21 C4 + 20 C128 compressed layers in 22-tuple groups; a 256-token block packs "
        "22 x 37,440 B + 21 x 8,640 B + 20 x 1,728 B = 1,039,680 B"
    )


@pytest.mark.parametrize(
    ("version", "packed"),
    [
        ("0.26.0", True),
        ("v0.26.1", True),
        ("0.27.0rc1", True),
        ("0.26.0+cu130", True),
        ("1.0.0", True),
        ("0.25.1", False),
        ("0.15.1", False),
        (FORK, False),
        ("", False),
    ],
)
def test_upstream_releases_from_026_pack_like_026(version: str, packed: bool) -> None:
    assert packs_dsv4_upstream(version) is packed


@pytest.mark.parametrize(
    ("dcp", "dtype", "block", "message"),
    [
        (2, FP8, 256, "DeepSeek-V4 cannot use decode-context-parallel-size > 1"),
        (1, BF16, 256, "DeepSeek-V4 needs an fp8 KV cache, got bfloat16 (F14)"),
        (1, FP8, 64, "DeepSeek-V4 needs a block size that is a multiple of 128, got 64"),
    ],
)
def test_vllm_026_packing_rejects_what_the_fork_rejects(
    dcp: int, dtype: kv.KVDtype, block: int, message: str
) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        deepseek_v4_packed(DSV4, dcp, dtype, block, extra_layers=1, chunk=4096)
