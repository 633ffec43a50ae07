"""Where sm120 bench's short-prompt TTFTs part from `vllm bench serve`'s on a GPU server.

On the H200 (docs/gpu-proof.md, runs 22-23, Llama-3-8B's shape) the two tools agreed on
decode and on TTFT at 2,048 and 8,192 tokens, and their request functions agreed within 2.3%
at every length when one process alternated them request by request; yet across whole runs
our 256-token TTFTs read 18-26% lower. By place in the run the server showed two floors,
~21 ms and ~33 ms at 256 tokens, and our runs sat on the lower one more often. What differs
between the tools beyond the request function is the process they run in: `vllm bench serve`
lives in a process that imported vLLM (and with it torch), ours does not; and the phases it
runs a point in. This probe alternates, round by round on one running deployment, ways to
measure the same points:

  ours          sm120's bench (--tool ours) in a process of its own, as `sm120 bench` runs
  ours-in-vllm  the same, in a process that imported vLLM's bench module first
  ours-beside   the same as `ours`, while another process that imported vLLM and set up
                CUDA on the GPU idles beside it
  ours-phased   sm120's bench in its own process, its prefill points run in the phases that
                `vllm bench serve` runs them in: a pause, a warm-up request, a pause, the
                first measured prompt once as a test request, then the measured requests
  vllm          `vllm bench serve` (--tool vllm), as the GPU proof's bench runs it

and prints each one's median TTFT per length and round, their ratios to `ours`, the GPU's
compute processes seen while each ran, and its SM clock and power sampled every 100 ms.
By default it runs every condition but `ours-beside` (on the tiny model it read like `ours`).

    python benchmarks/short_ttft_probe.py --vllm-python PY [--rounds 6] [--lengths 256,768]
        [--conditions ours,ours-phased,vllm]

SM120_HOME must hold exactly one running deployment (`PROBE=N bash
benchmarks/gpu_proof_device.sh bench` launches one and runs this on it). Run 25 on an H200
(docs/gpu-proof.md) found every condition on the same moving floors: the cause was the
server's (no CUDA graph for a 256- or 768-token step), not the client's.
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
CONDITIONS = ("ours", "ours-in-vllm", "ours-beside", "ours-phased", "vllm")
DEFAULT_CONDITIONS = ("ours", "ours-in-vllm", "ours-phased", "vllm")
# What `vllm bench serve`'s process imports before it sends a request.
VLLM_IMPORT = "import vllm.benchmarks.serve"
# The process beside: vLLM's bench module, then a CUDA context on the GPU, then idle.
BESIDE = (
    f"{VLLM_IMPORT}; import torch, time; torch.zeros(1, device='cuda'); "
    "print('ready', flush=True); time.sleep(3600)"
)


def measure_once(tool: str, lengths: tuple[int, ...], requests: int, out: Path) -> None:
    """One bench in this process: decode, then each length; per length the TTFTs in ms.
    `tool` "ours-phased" is ours with the prefill points run in vLLM's phases."""
    from sm120.measure import bench
    from sm120.measure.bench import BenchOptions, run_bench
    from sm120.measure.target import target_for_deployment

    if tool == "ours-phased":
        # A probe, not a mode of the bench: the one phase of the bench it changes is swapped
        # in this throwaway process alone.
        bench._prefill = phased_prefill

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


def phased_prefill(run: Any, vllm: dict[str, Any]) -> None:
    """The bench's prefill points in the phases `vllm bench serve` runs them in
    (sm120.measure.bench builds one run for the warm-up and one for the measured requests,
    and `vllm bench serve` sends each run's first prompt once as a test before the run)."""
    from sm120.measure import bench

    del vllm  # this process measures with our client only
    for length in run.steps.lengths:
        warm = run.prompts(length, 1)
        bench._settle(run)
        bench._load(run, warm, bench.PREFILL_OUTPUT_TOKENS, 1)  # the warm-up run's test request
        bench._load(run, warm, bench.PREFILL_OUTPUT_TOKENS, 1)  # its one request
        measured = run.prompts(length, run.steps.length_requests)
        bench._settle(run)
        bench._load(run, measured[:1], bench.PREFILL_OUTPUT_TOKENS, 1)  # the test request
        result = bench._load(run, measured, bench.PREFILL_OUTPUT_TOKENS, 1)
        run.report["prefill"].append(
            {"prompt_tokens": length, "ttfts_ms": [round(t * 1000.0, 3) for t in result.ttfts]}
        )


@contextlib.contextmanager
def gpu_clocks(samples: list[tuple[float, float]]) -> Iterator[None]:
    """Appends (SM clock MHz, power W) every 100 ms while the block runs, from nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        yield
        return
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    query = ["nvidia-smi", "-i", gpu, "--query-gpu=clocks.sm,power.draw"]
    sampler = subprocess.Popen(
        [*query, "--format=csv,noheader,nounits", "-lms", "100"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        yield
    finally:
        sampler.terminate()
        printed, _ = sampler.communicate()
        for line in printed.splitlines():
            with contextlib.suppress(ValueError):
                clock, power = (float(cell) for cell in line.split(","))
                samples.append((clock, power))


def clock_summary(samples: list[tuple[float, float]]) -> dict[str, Any]:
    if not samples:
        return {}
    clocks = [clock for clock, _ in samples]
    return {
        "samples": len(samples),
        "sm_mhz_median": statistics.median(clocks),
        "sm_mhz_min": min(clocks),
        "sm_mhz_max": max(clocks),
        "power_w_median": round(statistics.median(power for _, power in samples), 1),
    }


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
    tool = condition if condition in ("vllm", "ours-phased") else "ours"
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
    samples: list[tuple[float, float]] = []
    with process_beside(args.vllm_python, condition == "ours-beside"), gpu_clocks(samples):
        apps = compute_apps()
        done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{condition} failed:\n{done.stderr[-2000:]}")
    ttfts: dict[str, list[float]] = json.loads(out.read_text())
    return {"ttfts_ms": ttfts, "gpu_apps": apps, "gpu": clock_summary(samples)}


def summarize(rounds: list[dict[str, Any]], lengths: tuple[int, ...]) -> dict[str, Any]:
    """Per length, each condition's median over the rounds of its per-round median TTFT,
    and that median's ratio to `ours`'s."""
    table: dict[str, Any] = {}
    conditions = [c for c in CONDITIONS if c in rounds[0]]
    for length in map(str, lengths):
        medians = {
            condition: [statistics.median(r[condition]["ttfts_ms"][length]) for r in rounds]
            for condition in conditions
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
    clocks = {
        condition: [r[condition]["gpu"]["sm_mhz_median"] for r in rounds if r[condition].get("gpu")]
        for condition in conditions
    }
    if all(clocks.values()):
        table["sm_mhz"] = {c: statistics.median(values) for c, values in clocks.items()}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--lengths", default="256,768")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument(
        "--conditions",
        default=",".join(DEFAULT_CONDITIONS),
        help=f"which to run, comma-separated, 'ours' among them (of {', '.join(CONDITIONS)})",
    )
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args()
    if not args.vllm_python:
        raise SystemExit("pass --vllm-python (a python that imports vLLM) or set VLLM_PYTHON")
    args.lengths = tuple(int(n) for n in args.lengths.split(","))
    conditions = tuple(c.strip() for c in args.conditions.split(",") if c.strip())
    unknown = sorted(set(conditions) - set(CONDITIONS))
    if unknown or "ours" not in conditions:
        raise SystemExit(
            f"--conditions {args.conditions!r}: unknown {unknown or 'none'}; name 'ours' and "
            f"any of {', '.join(CONDITIONS)}"
        )
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="short-ttft-probe-") as scratch:
        for number in range(args.rounds):
            # Rotated each round, so no condition always follows the same one.
            turn = number % len(conditions)
            order = conditions[turn:] + conditions[:turn]
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
                gpu = found[condition]["gpu"]
                clock = f"; SM {gpu['sm_mhz_median']:.0f} MHz median" if gpu else ""
                print(
                    f"round {number + 1} {condition:<13} median TTFT ms {medians} "
                    f"({took:.0f} s; GPU compute processes {apps}{clock})",
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
        if not length.isdigit():
            print(f"\nGPU SM clock, median over the rounds: {row}")
            continue
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
