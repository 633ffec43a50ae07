"""`sm120 plan` against the KV pool a real vLLM (CPU build) allocates.

The engine is started with a KV budget (VLLM_CPU_KVCACHE_SPACE) and a max-model-len that is
not a multiple of the block size, so the printed pool depends on how vLLM rounds a request
to blocks: 2 GiB at 1,000 tokens is 2,048,000 tokens with 128-token blocks, 2,080,507 with
16-token ones. The planner reads the same model's config.json and must print the same.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.integration.realstack import sm120, state_of

pytestmark = pytest.mark.integration

KV_GIB = 2
CONTEXT = 1000
KV_LINE = re.compile(r"CPU KV cache size: (?P<tokens>[\d,]+) tokens")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, engine_python: Path) -> Path:
    from sm120.engine.tiny_model import ensure_tiny_model

    dest = tmp_path_factory.mktemp("planner-models") / "tiny"
    return ensure_tiny_model(engine_python, dest, lambda _: None)


@pytest.fixture(scope="module")
def engine_log(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[str]:
    home = tmp_path_factory.mktemp("planner-home")
    port = free_port()
    try:
        launched = sm120(
            home, "launch", "tiny", "--port", str(port), "--model-dir", str(tiny_model),
            "--set", f"max-model-len={CONTEXT}", "--set", f"env.VLLM_CPU_KVCACHE_SPACE={KV_GIB}",
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr[-3000:]
        state = state_of(home)
        assert state is not None
        log = Path(state["log_path"])
        deadline = time.monotonic() + 30
        while not KV_LINE.search(log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.5)
        yield log.read_text()
    finally:
        sm120(home, "stop")


def test_planner_pool_equals_the_engine_log_line(
    engine_log: str, tiny_model: Path, tmp_path: Path
) -> None:
    found = KV_LINE.search(engine_log)
    assert found, engine_log[-3000:]
    engine_tokens = int(found["tokens"].replace(",", ""))
    planned = sm120(
        tmp_path, "plan", "tiny", "--gpus", "1", "--kv-memory-gib", str(KV_GIB),
        "--model-dir", str(tiny_model), "--max-model-len", str(CONTEXT), "--json",
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    data = json.loads(planned.stdout)
    assert data["dims_source"] == f"{tiny_model}/config.json"
    # 2 layers x K,V x 2 KV heads x 64 x 2 bytes, from the model's own config.json
    assert data["kv_bytes_per_token_per_rank"] == pytest.approx(1024, rel=0.03)
    assert abs(data["kv_pool_tokens"] - engine_tokens) <= 0.01 * engine_tokens
    assert data["kv_pool_tokens"] == engine_tokens
