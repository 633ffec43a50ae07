"""sm120's own decode and prefill figures against `vllm bench serve`, on one tiny server.

Starts `sm120 launch tiny` in a scratch SM120_HOME, then alternates rounds: every figure by
`vllm bench serve` (run in the engine's venv, its --save-result JSON parsed), then the same
figures by sm120's client. Same server, same prompt lengths, token counts and request
counts; medians over the rounds; the ratio sm120 / vllm per figure (the goal is within 5%).

Run: VLLM_PYTHON=... python benchmarks/bench_vs_vllm.py [--rounds 3] [--lengths 256,768]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sm120.measure.bench import BenchOptions, run_bench
from sm120.measure.target import target_for_deployment


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
    found = {"decode tok/s": float(report["decode"]["tps"])}
    for point in report["prefill"]:
        found[f"prefill tok/s @ {point['prompt_tokens']}"] = float(point["prefill_tps"])
        found[f"TTFT s @ {point['prompt_tokens']}"] = float(point["ttft_s"])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lengths", default="256,768")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=4)
    args = parser.parse_args()
    lengths = tuple(int(n) for n in args.lengths.split(","))
    with tempfile.TemporaryDirectory(prefix="sm120-bench-vs-vllm-") as scratch:
        home = Path(scratch)
        os.environ["SM120_HOME"] = str(home)
        port = free_port()
        launched = sm120(home, "launch", "tiny", "--port", str(port))
        if launched.returncode != 0:
            raise SystemExit(f"launch failed:\n{launched.stderr[-3000:]}")
        try:
            rows = compare(home, lengths, args)
        finally:
            sm120(home, "stop")
    print_table(rows, args.rounds)


def compare(home: Path, lengths: tuple[int, ...], args: argparse.Namespace) -> dict[str, Any]:
    target = target_for_deployment(None)
    samples: dict[str, dict[str, list[float]]] = {"vllm": {}, "sm120": {}}
    for number in range(1, args.rounds + 1):
        for tool in ("vllm", "ours"):
            options = BenchOptions(
                mode="quick",
                tool=tool,
                lengths=lengths,
                concurrency=(),
                decode_tokens=args.decode_tokens,
                requests=args.requests,
            )
            report = run_bench(target, options, lambda _line: None, home / "runs" / str(number))
            side = "vllm" if tool == "vllm" else "sm120"
            for name, value in figures(report).items():
                samples[side].setdefault(name, []).append(value)
            print(f"round {number} {side}: {figures(report)}", file=sys.stderr)
    return samples


def print_table(samples: dict[str, Any], rounds: int) -> None:
    print(f"figure (median of {rounds})        sm120      vllm bench serve   sm120/vllm")
    for name, theirs in samples["vllm"].items():
        ours = samples["sm120"][name]
        mine, their = statistics.median(ours), statistics.median(theirs)
        print(f"{name:<30} {mine:>10.3f}   {their:>14.3f}   {mine / their:>10.3f}")


if __name__ == "__main__":
    main()
