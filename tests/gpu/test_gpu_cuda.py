"""sm120 on a real NVIDIA GPU with a CUDA vLLM (`pytest -m gpu` on the device; CI skips these,
saying why). The full proof with its figures is benchmarks/gpu_proof.py; these are the
pass/fail checks of the same paths: doctor's JSON, the lifecycle of the GPU variant of the
tiny recipe, and the planner against the engine's own KV pool for one architecture."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, free_port
from tests.integration.realstack import engine_processes, sm120, state_of

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(REPO / "benchmarks"))


def test_doctor_json_is_one_document_and_names_the_gpu(tmp_path: Path) -> None:
    result = sm120(tmp_path, "doctor", "--json", timeout=300)
    document = json.loads(result.stdout)  # raises if anything else is on stdout
    gpus = [f for f in document["findings"] if f["id"] == "gpu0"]
    assert gpus, result.stdout[-2000:]
    arch = gpus[0]["data"]["arch"]
    assert arch.startswith("sm_"), gpus[0]
    if arch not in ("sm_120", "sm_121"):
        assert "not SM120/SM121" in gpus[0]["message"]
        assert "tiny -V gpu" in gpus[0]["message"]


def test_tiny_gpu_variant_launches_chats_and_stops(tmp_path: Path) -> None:
    from sm120.engine.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(Path(os.environ["VLLM_PYTHON"]), tmp_path / "tiny", print)
    port = free_port()
    home = tmp_path / "home"
    launched = sm120(
        home, "launch", "tiny", "-V", "gpu", "--port", str(port), "--model-dir", str(model),
        "--no-monitor",
    )  # fmt: skip
    try:
        assert launched.returncode == 0, launched.stderr[-3000:]
        assert "READY" in launched.stdout
        state = state_of(home)
        assert state is not None
        log = Path(state["log_path"]).read_text()
        # 4 GiB at 1,024 B/token (2 layers x K,V x 2 KV heads x 64 x 2 B), 16-token blocks
        assert "GPU KV cache size: 4,194,304 tokens" in log
        chat = sm120(home, "chat", "--max-tokens", "8", "hello")
        assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
        rows = json.loads(sm120(home, "status", "--json").stdout)
        assert rows[0]["running"] is True and rows[0]["health"] == 200, rows
    finally:
        stopped = sm120(home, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert engine_processes(port) == []


def test_planner_matches_the_engine_pool_for_glm47_fp8(tmp_path: Path) -> None:
    import argparse

    import gpu_proof

    args = argparse.Namespace(vllm_python=os.environ["VLLM_PYTHON"], planner_timeout=420)
    case = next(c for c in gpu_proof.PLANNER_CASES if c["kv_dtype"] == "fp8")
    model = gpu_proof.write_reduced(case["recipe"], tmp_path / "glm47")
    engine_args = [
        "--tensor-parallel-size", "1",
        "--kv-cache-memory-bytes", str(gpu_proof.PLANNER_KV_GIB * gpu_proof.GIB),
        "--max-model-len", str(case["context"]), "--block-size", str(case["block"]),
        "--kv-cache-dtype", "fp8", "--max-num-batched-tokens", str(case["mnbt"]),
    ]  # fmt: skip
    engine = gpu_proof.engine_kv_tokens(args, model, engine_args, tmp_path / "engine.log")
    planned = gpu_proof.plan_tokens(args, case, model, 1)
    assert planned["kv_pool_tokens"] == pytest.approx(engine, rel=0.01)
