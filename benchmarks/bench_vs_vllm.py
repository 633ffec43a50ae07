"""sm120's own decode and prefill figures against `vllm bench serve`, on one tiny server.

Starts `sm120 launch tiny` in a scratch SM120_HOME, then:
  1. tool level: rounds of `sm120 bench --tool vllm` (vllm bench serve in the engine's venv,
     its --save-result JSON parsed) and `sm120 bench --tool ours`, with the same prompt
     lengths, token counts and request counts, the tool that goes first swapped every round
     (so neither always runs on the tail of the other); medians over the rounds, and a 90%
     bootstrap interval of each ratio over the rounds, because on 2 shared cores one round of
     8 streams moves a figure by 10-20%; and each prompt length's TTFT by the request's
     place in its run. 16 requests per point by default: `vllm bench serve`'s first 2-4
     requests read 5-25% slow, and with 8 per point they moved its mean-based figures by
     ~5%. Its process burns seconds of CPU on imports and the dataset just before them; a
     3 s CPU burn before our own client's run slowed its first requests the same way, 2 s
     pause or not (likely the kernel's fair scheduler evening out that CPU at wake-ups);
  2. request level: vLLM's own request function against sm120's, alternating request by
     request (benchmarks/request_ab.py, run by the engine's Python), medians over all pairs
     and over the pairs where neither stream arrived in bursts.
Our prompts are built as `vllm bench serve --dataset-name random` builds its own (runs of
consecutive token ids over the vocabulary, decoded to text, exact length; see
sm120/measure/prompts.py), so both tools send text that costs the server the same to
tokenize; `--prompts text-pool` measures with the ordinary-text prompts of before.
The ratio is sm120 / vllm per figure (the goal: within 5%). Decode tok/s is the inverse mean
time per output token over the streams that did not arrive in one burst, one rule for both
tools (vLLM's side from its --save-detailed per-request record); "all streams" is the same
over every stream, which is what `vllm bench serve` prints as 1 / mean TPOT.

Run: VLLM_PYTHON=... python benchmarks/bench_vs_vllm.py [--rounds 12] [--requests 16]
     [--pairs 30] [--home DIR] [--prompts text-pool]    (~11 minutes with the defaults on 2
     cores)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sm120.measure.bench import BenchOptions, PromptSource, run_bench
from sm120.measure.target import Target, target_for_deployment

# `vllm bench serve`'s random prompts are runs of consecutive token ids; on the tiny model's
# 512-id vocabulary a run's prompt often starts where an earlier one did, and the prefix cache
# then serves most of it (seen: 768-token TTFTs of 7-15 ms among 30 ms ones, 31,360 cached
# tokens). Ours are runs of consecutive ids too, but no two of one bench start at the same id,
# so they never share a block. Off, both tools measure prefill; `sm120 bench` notes any cache
# hit in its report either way.
PREFIX_CACHE_OFF = ("--set", "enable-prefix-caching=false")

# per tool, per prompt length: each round's per-request TTFTs (ms) in the order sent
Positions = dict[str, dict[int, list[list[float]]]]


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def sm120(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SM120_HOME": str(home), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "sm120", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


def figures(report: dict[str, Any]) -> dict[str, float]:
    if not (report["decode"] or {}).get("tps"):
        raise SystemExit(f"no decode figure: {json.dumps(report['decode'])}; {report['notes']}")
    decode = report["decode"]
    # Every stream of a run in one burst leaves no inter-token time to invert: no "all
    # streams" figure that round (NaN; print_table leaves the round out of that row).
    every = decode["tps_all_requests"]
    found = {
        "decode tok/s": float(decode["tps"]),
        "decode tok/s, all streams": float("nan") if every is None else float(every),
        "bursty decode streams": float(decode["bursty"]),
        "prefix-cache hit tokens": float((report.get("prefix_cache") or {}).get("hit_tokens", 0)),
    }
    for point in report["prefill"]:
        found[f"prefill tok/s @ {point['prompt_tokens']}"] = float(point["prefill_tps"])
        found[f"TTFT s @ {point['prompt_tokens']}"] = float(point["ttft_s"])
        found[f"median TTFT s @ {point['prompt_tokens']}"] = float(point["median_ttft_s"])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--lengths", default="256,768")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument(
        "--home", type=Path, help="use the tiny deployment already running in this SM120_HOME"
    )
    parser.add_argument(
        "--prefix-caching",
        action="store_true",
        help="keep vLLM's prefix cache on (off by default: see PREFIX_CACHE_OFF)",
    )
    parser.add_argument(
        "--prompts",
        choices=("vllm-random", "text-pool"),
        help="how sm120 makes its prompts (sm120 bench's default when not given)",
    )
    args = parser.parse_args()
    lengths = tuple(int(n) for n in args.lengths.split(","))
    if args.home is not None:
        os.environ["SM120_HOME"] = str(args.home)
        rows, positions = compare(args.home, lengths, args)
        report(rows, positions, {n: request_level(n, args) for n in lengths}, args)
        return
    with tempfile.TemporaryDirectory(prefix="sm120-bench-vs-vllm-") as scratch:
        home = Path(scratch)
        os.environ["SM120_HOME"] = str(home)
        port = free_port()
        cache = () if args.prefix_caching else PREFIX_CACHE_OFF
        launched = sm120(home, "launch", "tiny", "--port", str(port), *cache)
        if launched.returncode != 0:
            raise SystemExit(f"launch failed:\n{launched.stderr[-3000:]}")
        try:
            rows, positions = compare(home, lengths, args)
            pairs = {n: request_level(n, args) for n in lengths}
        finally:
            sm120(home, "stop")
    report(rows, positions, pairs, args)


def report(
    rows: dict[str, Any],
    positions: Positions,
    pairs: dict[int, Any],
    args: argparse.Namespace,
) -> None:
    print_table(rows, args.rounds)
    print_positions(positions)
    for length, found in pairs.items():
        print_pairs(found, length, args.decode_tokens)


def compare(
    home: Path, lengths: tuple[int, ...], args: argparse.Namespace
) -> tuple[dict[str, Any], Positions]:
    return run_rounds(
        target_for_deployment(None),
        home,
        rounds=args.rounds,
        lengths=lengths,
        decode_tokens=args.decode_tokens,
        requests=args.requests,
        report=lambda line: print(line, file=sys.stderr),
        prompts=args.prompts,
    )


def run_rounds(
    target: Target,
    home: Path,
    *,
    rounds: int,
    lengths: tuple[int, ...],
    decode_tokens: int,
    requests: int,
    report: Callable[[str], None],
    vllm_python: str | None = None,
    prompts: PromptSource | None = None,
    after_round: Callable[[dict[str, dict[str, list[float]]]], None] | None = None,
) -> tuple[dict[str, Any], Positions]:
    """Rounds of both tools, the one that goes first swapped every round; each figure's
    samples per side, and each prompt length's TTFTs by place in the run. `after_round` sees
    the samples so far after each round (a run cut short keeps what it measured)."""
    samples: dict[str, dict[str, list[float]]] = {"vllm": {}, "sm120": {}}
    positions: Positions = {"vllm": {}, "sm120": {}}
    for number in range(1, rounds + 1):
        for tool in ("vllm", "ours") if number % 2 else ("ours", "vllm"):
            options = BenchOptions(
                mode="quick",
                tool=tool,
                lengths=lengths,
                concurrency=(),
                decode_tokens=decode_tokens,
                requests=requests,
                vllm_python=vllm_python,
            )
            if prompts is not None:
                options = dataclasses.replace(options, prompts=prompts)
            found = run_bench(target, options, lambda _line: None, home / "runs" / str(number))
            side = "vllm" if tool == "vllm" else "sm120"
            for name, value in figures(found).items():
                samples[side].setdefault(name, []).append(value)
            for point in found["prefill"]:
                runs = positions[side].setdefault(point["prompt_tokens"], [])
                runs.append(point.get("ttfts_ms") or [])
            report(f"round {number} {side}: {figures(found)}")
        if after_round is not None:
            after_round(samples)
    return samples, positions


def print_positions(positions: Positions) -> None:
    """TTFT by the request's place in its run, median over the rounds: a run that starts
    slow and settles shows as falling figures on the left (a client's start-up, not the
    server's prefill speed)."""
    for length, theirs in positions["vllm"].items():
        ours = positions["sm120"].get(length, [])
        print(f"\nTTFT ms @ {length} by place in the run (median over rounds)")
        for side, runs in (("sm120", ours), ("vllm", theirs)):
            count = min((len(run) for run in runs), default=0)
            places = [statistics.median(run[i] for run in runs) for i in range(count)]
            print(f"{side:<6} " + " ".join(f"{value:5.1f}" for value in places))


def request_level(length: int, args: argparse.Namespace) -> dict[str, Any]:
    from sm120.engine.engine_env import resolve_engine_python

    target = target_for_deployment(None)
    python = resolve_engine_python(None, allow_provision=False, progress=print)
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OPENAI_API_KEY": target.api_key or "", "PYTHONPATH": str(repo)}
    script = repo / "benchmarks" / "request_ab.py"
    argv = [str(python), str(script), target.base_url, target.model, str(args.pairs)]
    result = subprocess.run(
        [*argv, str(length), str(args.decode_tokens)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"request_ab.py failed:\n{result.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def print_pairs(found: dict[str, Any], length: int, out: int) -> None:
    pairs = list(zip(found["vllm"], found["sm120"], strict=True))
    smooth = [(a, b) for a, b in pairs if not a["bursty"] and not b["bursty"]]
    print(
        f"\nrequest level, {length}-token prompts, {out} tokens: {len(pairs)} pairs, "
        f"{len(smooth)} with neither stream bursty"
    )
    print("figure (median)                 sm120      vLLM request fn   sm120/vllm")
    for label, chosen in (("all pairs", pairs), ("smooth pairs", smooth)):
        if not chosen:
            print(f"{label}: none")
            continue
        for figure in ("ttft", "decode"):
            theirs = [a[figure] for a, _ in chosen if a[figure]]
            ours = [b[figure] for _, b in chosen if b[figure]]
            mine, their = statistics.median(ours), statistics.median(theirs)
            name = f"{figure} ({label})"
            print(f"{name:<30} {mine:>10.4f}   {their:>14.4f}   {mine / their:>10.3f}")


def print_table(samples: dict[str, Any], rounds: int) -> None:
    print(
        f"figure (median of {rounds})        sm120      vllm bench serve   sm120/vllm"
        "   90% interval"
    )
    for name, both in samples["vllm"].items():
        rounds_kept = [
            (a, b)
            for a, b in zip(samples["sm120"][name], both, strict=True)
            if not (math.isnan(a) or math.isnan(b))
        ]
        if not rounds_kept:
            print(f"{name:<30} {'-':>10}   {'-':>14}   {'-':>10}")
            continue
        ours, theirs = [a for a, _ in rounds_kept], [b for _, b in rounds_kept]
        mine, their = statistics.median(ours), statistics.median(theirs)
        if not their:
            print(f"{name:<30} {mine:>10.3f}   {their:>14.3f}   {'-':>10}")
            continue
        low, high = ratio_interval(ours, theirs)
        print(
            f"{name:<30} {mine:>10.3f}   {their:>14.3f}   {mine / their:>10.3f}"
            f"   {low:.3f}-{high:.3f}"
        )


def ratio_interval(
    ours: list[float], theirs: list[float], resamples: int = 2000
) -> tuple[float, float]:
    """5th and 95th percentile of median(ours) / median(theirs) with the rounds resampled
    (a round keeps its two runs together: they ran back to back). Fixed seed: the same
    samples always print the same interval."""
    rng = random.Random(0)
    rounds = list(zip(ours, theirs, strict=True))
    ratios = []
    for _ in range(resamples):
        picked = [rng.choice(rounds) for _ in rounds]
        denominator = statistics.median(b for _, b in picked)
        if denominator:
            ratios.append(statistics.median(a for a, _ in picked) / denominator)
    if not ratios:
        return float("nan"), float("nan")
    ratios.sort()
    return ratios[int(0.05 * (len(ratios) - 1))], ratios[int(0.95 * (len(ratios) - 1))]


if __name__ == "__main__":
    main()
