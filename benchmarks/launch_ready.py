"""Time-to-READY: `sm120 launch tiny` against a bare start of the same engine command line.

Both are timed from process start until the server answers /health with 200 AND one chat
completion has returned (sm120's READY includes exactly that smoke test). Pairs alternate on
the same machine with the torch.compile cache kept (warm) and one API key for both sides
(benchmarks/bare_engine.py says why); then one cold start (a fresh VLLM_CACHE_ROOT) is
compared with a warm one.

Run: VLLM_PYTHON=... python benchmarks/launch_ready.py [--pairs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bare_engine import bare_ready, free_port

from sm120.engine.tiny_model import ensure_tiny_model
from sm120.plan.resolve import PlanRequest

# One key for both sides and every start: vLLM hashes VLLM_API_KEY into its compile-cache key
# (benchmarks/bare_engine.py), and a deployment keeps its key from one launch to the next.
KEY = "launch-ready-fixed-key"


def bare_start(python: str, model: Path, cache: Path) -> float:
    request = PlanRequest(recipe="tiny", model_dir=str(model))
    return bare_ready(python, request, cache, KEY)


def sm120_start(model: Path, cache: Path, home: Path) -> float:
    port = free_port()
    env = {**os.environ, "SM120_HOME": str(home), "VLLM_CACHE_ROOT": str(cache), "NO_COLOR": "1"}
    started = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sm120",
            "launch",
            "tiny",
            "--port",
            str(port),
            "--model-dir",
            str(model),
            "--api-key",
            KEY,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - started
    subprocess.run(
        [sys.executable, "-m", "sm120", "stop"], env=env, capture_output=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"sm120 launch failed:\n{result.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=3)
    pairs = parser.parse_args().pairs
    python = os.environ.get("VLLM_PYTHON") or sys.exit("set VLLM_PYTHON to the engine's python")
    work = Path(tempfile.mkdtemp(prefix="sm120-bench-"))
    model = ensure_tiny_model(Path(python), work / "tiny", lambda _: None)
    warm_cache = work / "cache-warm"
    print("priming the compile cache...", flush=True)
    bare_start(python, model, warm_cache)
    ours, bare = [], []
    for index in range(pairs):
        # Alternate which goes first so drift on the machine hits both equally.
        order = ("sm120", "bare") if index % 2 == 0 else ("bare", "sm120")
        for which in order:
            if which == "sm120":
                ours.append(sm120_start(model, warm_cache, work / "home"))
            else:
                bare.append(bare_start(python, model, warm_cache))
        print(f"pair {index + 1}: sm120 {ours[-1]:.1f}s  bare {bare[-1]:.1f}s", flush=True)
    cold = sm120_start(model, work / "cache-cold", work / "home-cold")
    warm = sm120_start(model, work / "cache-cold", work / "home-warm")
    ours_median, bare_median = statistics.median(ours), statistics.median(bare)
    print(
        f"time to READY, warm, median of {pairs}: sm120 {ours_median:.1f}s, bare engine "
        f"{bare_median:.1f}s, ratio {ours_median / bare_median:.3f} (goal <= 1.05)"
    )
    print(f"sm120 cold start {cold:.1f}s vs warm start {warm:.1f}s (cold/warm {cold / warm:.2f})")


if __name__ == "__main__":
    main()
