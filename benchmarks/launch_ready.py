"""Time-to-READY: `sm120 launch tiny` against a bare start of the same engine command line.

Both are timed from process start until the server answers /health with 200 AND one chat
completion has returned (sm120's READY includes exactly that smoke test). Pairs alternate on
the same machine with the torch.compile cache kept (warm); then one cold start (a fresh
VLLM_CACHE_ROOT) is compared with a warm one.

Run: VLLM_PYTHON=... python benchmarks/launch_ready.py [--pairs 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sm120.plan import PlanRequest, resolve
from sm120.render.argv import render_argv
from sm120.render.environment import render_env
from sm120.tiny_model import ensure_tiny_model


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def bare_start(python: str, model: Path, cache: Path) -> float:
    port = free_port()
    plan = resolve(PlanRequest(recipe="tiny", model_dir=str(model), port=port))
    argv = render_argv(plan, python=python)
    env = {**os.environ, **render_env(plan), "VLLM_CACHE_ROOT": str(cache)}
    started = time.perf_counter()
    engine = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if engine.poll() is not None:
                raise SystemExit(f"bare engine exited with {engine.returncode}")
            time.sleep(0.5)
        httpx.post(
            f"{base}/v1/chat/completions",
            timeout=120,
            json={
                "model": "tiny",
                "max_tokens": 16,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Reply with exactly: READY"}],
            },
        )
        return time.perf_counter() - started
    finally:
        os.killpg(engine.pid, signal.SIGTERM)
        engine.wait(timeout=60)


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
                ours.append(sm120_start(model, warm_cache, work / f"home{index}"))
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
