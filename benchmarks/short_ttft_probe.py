"""Where sm120 bench's short-prompt TTFTs part from `vllm bench serve`'s on a GPU server.

On the H200 (docs/gpu-proof.md, runs 22-23, Llama-3-8B's shape) the two tools agreed on
decode and on TTFT at 2,048 and 8,192 tokens, and their request functions agreed within 2.3%
at every length when one process alternated them request by request; yet across whole runs
our 256-token TTFTs read 18-26% lower. By place in the run the server showed two floors,
~21 ms and ~33 ms at 256 tokens, and our runs sat on the lower one more often. What differs
between the tools beyond the request function is the process they run in: `vllm bench serve`
lives in a process that imported vLLM (and with it torch), ours does not. This probe
alternates, round by round on one running deployment, four ways to measure the same points:

  ours          sm120's bench (--tool ours) in a process of its own, as `sm120 bench` runs
  ours-in-vllm  the same, in a process that imported vLLM's bench module first
  ours-beside   the same as `ours`, while another process that imported vLLM and set up
                CUDA on the GPU idles beside it
  vllm          `vllm bench serve` (--tool vllm), as the GPU proof's bench runs it

and prints each one's median TTFT per length and round, their ratios to `ours`, and the GPU's
compute processes seen while each ran.

    python benchmarks/short_ttft_probe.py --vllm-python PY [--rounds 6] [--lengths 256,768]

SM120_HOME must hold exactly one running deployment (benchmarks/gpu_proof_device.sh probe
launches one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONDITIONS = ("ours", "ours-in-vllm", "ours-beside", "vllm")
# What `vllm bench serve`'s process imports before it sends a request.
VLLM_IMPORT = "import vllm.benchmarks.serve"
# The process beside: vLLM's bench module, then a CUDA context on the GPU, then idle.
BESIDE = (
    f"{VLLM_IMPORT}; import torch, time; torch.zeros(1, device='cuda'); "
    "print('ready', flush=True); time.sleep(3600)"
)


def measure_once(tool: str, lengths: tuple[int, ...], requests: int, out: Path) -> None:
    """One bench in this process: decode, then each length; per length the TTFTs in ms."""
    from sm120.measure.bench import BenchOptions, run_bench
    from sm120.measure.target import target_for_deployment

    options = BenchOptions(
        mode="quick",
        tool="vllm" if tool == "vllm" else "ours",
        lengths=lengths,
        concurrency=(),
        decode_tokens=16,
        requests=requests,
        vllm_python=os.environ.get("VLLM_PYTHON"),
    )
    found = run_bench(target_for_deployment(None), options, lambda _line: None, out.parent)
    ttfts = {str(point["prompt_tokens"]): point.get("ttfts_ms") or [] for point in found["prefill"]}
    out.write_text(json.dumps(ttfts))


def compute_apps() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    listing = subprocess.run(
        [
            "nvidia-smi",
            "--query-compute-apps=pid,process_name,used_memory",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line.strip() for line in listing.stdout.splitlines() if line.strip()]


@contextlib.contextmanager
def process_beside(python: str, wanted: bool) -> Iterator[None]:
    if not wanted:
        yield
        return
    beside = subprocess.Popen(
        [python, "-c", BESIDE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert beside.stdout is not None
        beside.stdout.readline()  # "ready": imported, CUDA context made
        yield
    finally:
        beside.kill()
        beside.wait()


def run_condition(
    condition: str, args: argparse.Namespace, scratch: Path, number: int
) -> dict[str, Any]:
    out = scratch / f"{condition}-{number}" / "ttfts.json"
    out.parent.mkdir(parents=True)
    tool = "vllm" if condition == "vllm" else "ours"
    # ours-in-vllm runs under the engine's python, the other "ours" under this one: the
    # engine's can import vLLM, and a light interpreter is what `sm120 bench` runs on.
    python = args.vllm_python if condition == "ours-in-vllm" else sys.executable
    prelude = f"{VLLM_IMPORT}; " if condition == "ours-in-vllm" else ""
    code = (
        f"{prelude}import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); "
        "import short_ttft_probe as probe; "
        f"probe.measure_once({tool!r}, {args.lengths!r}, {args.requests}, "
        f"__import__('pathlib').Path({str(out)!r}))"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with process_beside(args.vllm_python, condition == "ours-beside"):
        apps = compute_apps()
        done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{condition} failed:\n{done.stderr[-2000:]}")
    ttfts: dict[str, list[float]] = json.loads(out.read_text())
    return {"ttfts_ms": ttfts, "gpu_apps": apps}


def summarize(rounds: list[dict[str, Any]], lengths: tuple[int, ...]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for length in map(str, lengths):
        medians = {
            condition: [statistics.median(r[condition]["ttfts_ms"][length]) for r in rounds]
            for condition in CONDITIONS
        }
        base = statistics.median(medians["ours"])
        table[length] = {
            condition: {
                "median_ms": round(statistics.median(values), 2),
                "per_round_ms": [round(v, 2) for v in values],
                "ratio_to_ours": round(statistics.median(values) / base, 3),
            }
            for condition, values in medians.items()
        }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--lengths", default="256,768")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args()
    if not args.vllm_python:
        raise SystemExit("pass --vllm-python (a python that imports vLLM) or set VLLM_PYTHON")
    args.lengths = tuple(int(n) for n in args.lengths.split(","))
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="short-ttft-probe-") as scratch:
        for number in range(args.rounds):
            # Rotated each round, so no condition always follows the same one.
            order = CONDITIONS[number % 4 :] + CONDITIONS[: number % 4]
            found = {}
            for condition in order:
                started = time.perf_counter()
                found[condition] = run_condition(condition, args, Path(scratch), number)
                medians = {
                    n: round(statistics.median(v), 1)
                    for n, v in found[condition]["ttfts_ms"].items()
                }
                took = time.perf_counter() - started
                apps = len(found[condition]["gpu_apps"])
                print(
                    f"round {number + 1} {condition:<13} median TTFT ms {medians} "
                    f"({took:.0f} s; GPU compute processes {apps})",
                    flush=True,
                )
            rounds.append(found)
    result = {
        "lengths": args.lengths,
        "requests": args.requests,
        "rounds": rounds,
        "summary": summarize(rounds, args.lengths),
    }
    for length, row in result["summary"].items():
        print(f"\nTTFT @ {length} tokens, median over {args.rounds} rounds of each round's median")
        for condition, figures in row.items():
            ratio = figures["ratio_to_ours"]
            print(
                f"  {condition:<13} {figures['median_ms']:7.2f} ms   x{ratio:.3f}   "
                f"rounds {figures['per_round_ms']}"
            )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
