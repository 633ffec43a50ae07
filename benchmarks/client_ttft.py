"""What each bench client adds to the TTFT it reports: `sm120 bench`'s client and
`vllm bench serve` against a server that streams its first token the moment a request
arrives, so what is left is the client's own time (its HTTP stack, its stream parsing) plus a
constant of the server below.

On a tiny model's 10-30 ms TTFTs a millisecond of client is several percent of the figure,
which is why the GPU proof's TTFT ratios can sit below 1 while the engine does the same work
for both tools (docs/gpu-proof.md).

    python benchmarks/client_ttft.py --vllm-python PY [--rounds 3] [--requests 32]

PY is any vLLM's python (the CPU build does: no model is served, its tokenizer code only
builds vLLM's random prompts from the tiny test model's tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LENGTHS = (256, 2048, 8192)
OUTPUT_TOKENS = 8
MODEL = "tiny"


def serve(port: int) -> None:
    """The instant server: each completion streams its tokens at once, then usage, then
    [DONE], over keep-alive HTTP/1.1 like vLLM's."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        count = int(body.get("max_tokens") or 1)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        token = {"object": "text_completion", "model": body.get("model"), "usage": None}
        choice = {"index": 0, "text": " a", "logprobs": None, "finish_reason": None}
        for _ in range(count):
            await response.write(b"data: " + json.dumps({**token, "choices": [choice]}).encode())
            await response.write(b"\n\n")
        usage = {"prompt_tokens": 1, "completion_tokens": count, "total_tokens": count + 1}
        closing = {**token, "choices": [], "usage": usage}
        await response.write(b"data: " + json.dumps(closing).encode() + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_up(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit("the instant server did not start")


def vllm_ttfts_ms(python: str, base_url: str, tokenizer: Path, length: int, requests: int,
                  seed: int, work: Path) -> list[float]:  # fmt: skip
    from sm120.measure.target import Target
    from sm120.measure.vllm_bench import SHIM, ServeRun, serve_args

    target = Target(
        name="instant", base_url=base_url, api_key=None, model=MODEL,
        model_root=str(tokenizer), max_model_len=None,
    )  # fmt: skip
    run = ServeRun(f"len{length}-{seed}", length, OUTPUT_TOKENS, requests, 1, seed)
    argv = [python, "-c", SHIM, json.dumps([serve_args(run, target, str(work))])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed: {done.stderr[-800:]}")
    result = json.loads((work / f"{run.label}.json").read_text())
    if result["completed"] != requests:
        raise SystemExit(f"vllm bench serve: {result['failed']} of {requests} requests failed")
    return [value * 1000 for value in result["ttfts"]]


def our_ttfts_ms(base_url: str, length: int, requests: int) -> list[float]:
    from sm120.measure.load import run_load

    # The instant server does not read the prompt; the client still sends every byte of it
    # (~1.7 bytes a token, as vLLM's random prompts on this tokenizer).
    prompts = [f"{number} " + "ab " * int(length * 0.55) for number in range(requests)]
    result = run_load(base_url, None, MODEL, prompts, max_tokens=OUTPUT_TOKENS)
    return [
        (timing.first_at - timing.started) * 1000
        for timing in result.requests
        if timing.first_at is not None
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if not args.vllm_python:
        parser.error("pass --vllm-python (any vLLM's python) or set VLLM_PYTHON")
    from sm120.engine.tiny_model import ensure_tiny_model

    work = Path(tempfile.mkdtemp(prefix="client-ttft-"))
    tokenizer = ensure_tiny_model(Path(args.vllm_python), work / "tiny", lambda _line: None)
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_up(port)
        samples: dict[int, dict[str, list[float]]] = {n: {"sm120": [], "vllm": []} for n in LENGTHS}
        for number in range(1, args.rounds + 1):
            for length in LENGTHS:
                # The tool that goes first swaps every round.
                for tool in ("vllm", "sm120") if number % 2 else ("sm120", "vllm"):
                    if tool == "vllm":
                        ttfts = vllm_ttfts_ms(args.vllm_python, base_url, tokenizer, length,
                                              args.requests, number, work)  # fmt: skip
                    else:
                        ttfts = our_ttfts_ms(base_url, length, args.requests)
                    samples[length][tool].append(statistics.median(ttfts))
            print(f"round {number} done", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"\nmedian client TTFT against an instant server, ms ({args.rounds} rounds of "
          f"{args.requests} requests, concurrency 1)")  # fmt: skip
    print(f"{'prompt tokens':>13} {'sm120 bench':>12} {'vllm bench':>11} {'vllm - sm120':>13}")
    for length, sides in samples.items():
        ours, theirs = statistics.median(sides["sm120"]), statistics.median(sides["vllm"])
        print(f"{length:>13} {ours:>12.3f} {theirs:>11.3f} {theirs - ours:>13.3f}")


if __name__ == "__main__":
    main()
