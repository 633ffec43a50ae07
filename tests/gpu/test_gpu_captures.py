"""What the GPU proof captured on real H200s (benchmarks/gpu_proof.py, 2026-11-26), read back by
the parts that will read such output for users: doctor --from, the log parser, the metrics
reader and the planner. Runs everywhere; the captures are in tests/data (SOURCES.md there)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.logs.events import KvCache, Ready, Stats
from sm120.logs.logparse import parse_text
from sm120.monitor.metrics import parse_metrics
from tests.helpers import DATA_DIR, REPO, invoke

sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_proof

PLANNER_LOGS = sorted((DATA_DIR / "gpu_proof").glob("planner-*-dcp[0-9].log"))
LABEL = re.compile(r"planner-(?P<recipe>\w+)-(?P<kv>\w+)-tp(?P<tp>\d)-dcp(?P<dcp>\d)\.log")


def test_doctor_reads_the_four_h200s_and_their_nvlink(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "doctor", "--from", str(DATA_DIR / "nvidia_smi" / "h200_4x_580"))
    assert code == 0
    assert "NVIDIA driver 580.159.04, CUDA 13.0 (4 GPU(s)" in out
    for index in range(4):
        assert (
            f"GPU{index}: NVIDIA H200, sm_90, 143,771 MiB total, 143,771 MiB free: "
            "not SM120/SM121; validated here: tiny -V gpu"
        ) in out
    assert "NVLink between all GPUs (6 GPU pairs: NV18 x6)" in out


def test_log_parser_follows_a_real_cuda_start_to_ready_and_its_stats() -> None:
    events = parse_text((DATA_DIR / "gpu_proof" / "engine-v0.26.0-h200-tiny-gpu.log").read_text())
    kv = [e for e in events if isinstance(e, KvCache)]
    assert [(e.tokens, e.device) for e in kv] == [(4194304, "GPU")]
    assert any(isinstance(e, Ready) for e in events)
    stats = [e for e in events if isinstance(e, Stats)]
    assert stats and max(s.gen_tps or 0.0 for s in stats) > 100  # the bench's decode phase


def test_metrics_reader_takes_vllm_026s_page() -> None:
    snapshot = parse_metrics((DATA_DIR / "monitor" / "vllm-0.26.0-h200-metrics.txt").read_text())
    assert snapshot.counter("prompt_tokens") and snapshot.counter("prompt_tokens") > 100_000
    assert snapshot.counter("generation_tokens") and snapshot.counter("generation_tokens") > 0
    assert snapshot.kv_usage is not None and 0.0 <= snapshot.kv_usage <= 1.0
    assert snapshot.started_at is not None


@pytest.mark.parametrize("log", PLANNER_LOGS, ids=[p.stem for p in PLANNER_LOGS])
def test_planner_replays_each_captured_engine_pool(log: Path, tmp_path: Path) -> None:
    """The planner, given the inputs of a captured GPU run, prints the pool that run's engine
    printed (or the run failed before it allocated, and the log says why)."""
    label = LABEL.fullmatch(log.name)
    assert label, log.name
    found = gpu_proof.KV_LINE.search(log.read_text(errors="replace"))
    if found is None:
        # Only the first attempt, kept to show why the dummy loader needed the post-load step.
        assert log.name == "planner-dsv4-fp8-tp1-dcp1-without-post-load.log", log.name
        return
    case = next(
        c
        for c in gpu_proof.PLANNER_CASES
        if c["recipe"] == label["recipe"] and c["kv_dtype"] == label["kv"]
    )
    model = gpu_proof.write_reduced(case["recipe"], tmp_path / case["recipe"])
    args = argparse.Namespace(vllm_python=sys.executable)
    planned = gpu_proof.plan_tokens(args, case, model, int(label["tp"]), int(label["dcp"]))
    assert planned["kv_pool_tokens"] == int(found["tokens"].replace(",", ""))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_dsv4_captures_at_every_tp_reached_the_allocator(tp: int) -> None:
    """So the replay above compares them instead of taking the no-KV-line exit."""
    log = DATA_DIR / "gpu_proof" / f"planner-dsv4-fp8-tp{tp}-dcp1.log"
    text = log.read_text(errors="replace")
    assert gpu_proof.KV_LINE.search(text)
    assert "Initializing a V1 LLM engine (v0.26.0)" in text
    assert gpu_proof.PROOF_ENGINE_VERSION == "0.26.0"
