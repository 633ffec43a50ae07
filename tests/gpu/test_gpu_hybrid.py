"""Hybrid linear-attention layouts against CUDA vLLM's own allocator (needs a GPU).

Runs benchmarks/hybrid_proof.py: every case (Qwen3-Next's Gated DeltaNet layers and
Kimi-Linear's KDA layers, with and without prefix caching, fp8, MTP) is served with dummy
weights and planned with the same inputs; the plan's pool must equal the engine's "GPU KV cache
size" to the token. HYBRID_PROOF_OUT keeps the run's JSON and engine logs (the device run
that committed benchmarks/results/gpu-proof-hybrid.json passed it there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.gpu


def test_every_hybrid_case_is_planned_to_the_token() -> None:
    out = Path(os.environ.get("HYBRID_PROOF_OUT") or tempfile.mkdtemp(prefix="hybrid-proof-"))
    python = os.environ["VLLM_PYTHON"]
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "hybrid_proof.py"), "--vllm-python", python,
         "--out", str(out)],
        check=False, timeout=560,
    )  # fmt: skip
    rows = json.loads((out / "hybrid-proof.json").read_text())["rows"]
    assert len(rows) >= 6
    for row in rows:
        assert "error" not in row, (row["case"], row.get("error"))
        assert row["plan_tokens"] == row["vllm_tokens"], row
