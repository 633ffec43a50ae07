"""The GPU proof: sm120 driving CUDA vLLM on a real NVIDIA GPU, with its figures written down.

Run from the project root on a machine with an NVIDIA GPU and a CUDA vLLM (the `device`
tool's H100/H200; docs/gpu-proof.md says how the engine gets there):

    python benchmarks/gpu_proof.py --vllm-python /tmp/py --out DIR [--steps ...] [--tp 2]

Steps (all by default, in this order; each one's failure is recorded and the rest still run):
  facts     device, driver, CUDA, torch and vLLM versions
  captures  nvidia-smi (table, -q, topo -m, the doctor's CSV query) into captures.tgz
  doctor    `sm120 doctor --json` prints exactly one JSON document; what it says of the GPU
  launch    time to READY through `sm120 launch tiny -V gpu` over a bare `vllm serve` of the
            same command line to its first answer, warm compile cache, pairs alternating;
            then launch, chat, status (the deployment stays up for `bench`)
  bench     `sm120 bench` against `vllm bench serve` on that server, the tool that goes
            first swapped every round: decode tok/s and TTFT at 256/768/2048/8192 tokens,
            both tools' prompts built as vLLM's random dataset builds them (--bench-prompts
            text-pool: sm120's ordinary-text prompts of before); --bench-pairs N: vLLM's
            request function against ours, request by request (benchmarks/request_ab.py);
            --bench-probe N: rounds of benchmarks/short_ttft_probe.py; then /metrics and
            the engine log into captures.tgz, and stop (--bench-rounds 0: no tool rounds)
  planner   reduced-layer configs of GLM-4.7, GLM-5.2 and DeepSeek-V4-Flash
            (benchmarks/reduced_models.py) served with dummy weights at a fixed
            --kv-cache-memory-bytes; the engine's "GPU KV cache size" against `sm120 plan`
            given the same inputs, at TP --tp

Each run writes DIR/gpu-proof-<label>.json (the steps it ran). `--merge A.json B.json ...`
combines such files into benchmarks/results/gpu-proof.json and gpu-proof.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sm120.measure.bench import BenchOptions
from sm120.plan.resolve import PlanRequest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bare_engine  # noqa: E402
from bench_vs_vllm import ratio_interval, request_level, run_rounds  # noqa: E402
from reduced_models import write_reduced  # noqa: E402
from short_ttft_probe import CONDITIONS as CONDITION_NAMES  # noqa: E402

STEPS = ("facts", "captures", "doctor", "launch", "bench", "planner")
LENGTHS = (256, 768, 2048, 8192)
GIB = 1024**3
KV_LINE = re.compile(r"GPU KV cache size: (?P<tokens>[\d,]+) tokens")
# What the doctor reads off a machine, as a user would paste it (sm120/doctor/capture.py).
CSV_QUERY = "index,name,compute_cap,memory.total,memory.used,driver_version,pcie.link.gen.max"
NVIDIA_SMI_CAPTURES = {
    "nvidia_smi.txt": ["nvidia-smi"],
    "nvidia_smi_q.txt": ["nvidia-smi", "-q"],
    "nvidia_smi_topo.txt": ["nvidia-smi", "topo", "-m"],
    "nvidia_smi_csv.txt": ["nvidia-smi", f"--query-gpu={CSV_QUERY}", "--format=csv"],
}
# The planner cases: what is served and planned with the same inputs. The KV budget is a
# whole number of GiB so that both sides start from the same byte count.
PLANNER_CASES: tuple[dict[str, Any], ...] = (
    {"recipe": "glm47", "kv_dtype": "auto", "block": 16, "mnbt": 8192, "context": 32768},
    {"recipe": "glm47", "kv_dtype": "fp8", "block": 16, "mnbt": 8192, "context": 32768},
    {"recipe": "glm52", "kv_dtype": "fp8", "block": 64, "mnbt": 8192, "context": 32768},
    {"recipe": "dsv4", "kv_dtype": "fp8", "block": 256, "mnbt": 4096, "context": 32768},
)
PLANNER_KV_GIB = 4
# The CUDA vLLM the proof serves (bundle wheel): the plans it is compared with model this
# engine's allocator, not the recipes' images (DeepSeek-V4's fork packs its KV differently).
PROOF_ENGINE_VERSION = "0.26.0"

Log = Callable[[str], None]


def log(line: str) -> None:
    print(f"[gpu-proof {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 900) -> Any:
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def sm120_env(home: Path, vllm_python: str, tree: Path = REPO) -> dict[str, str]:
    """The environment sm120 runs in: its own home, and `tree`'s sm120 package first on the
    path (another checkout's, for an A/B of two commits with --compare-tree)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM120_")}
    env.update(SM120_HOME=str(home), NO_COLOR="1", VLLM_PYTHON=vllm_python)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    return env


def sm120(home: Path, vllm_python: str, *args: str, timeout: float = 1200) -> Any:
    return run(
        [sys.executable, "-m", "sm120", *args], env=sm120_env(home, vllm_python), timeout=timeout
    )


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ---- facts, captures, doctor ------------------------------------------------------------


def device_name() -> str:
    """'2x NVIDIA H200': what every part names its machine by, so that a figure merged from
    several runs says which card measured it."""
    smi = run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    names = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
    return f"{len(names)}x {names[0]}" if names else "unknown"


def step_facts(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    smi = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    names = [line.split(",")[0].strip() for line in smi.stdout.splitlines() if line.strip()]
    probe = (
        "import json, torch, vllm; print(json.dumps({'torch': torch.__version__, "
        "'cuda': torch.version.cuda, 'vllm': vllm.__version__}))"
    )
    engine = run([args.vllm_python, "-c", probe], timeout=300)
    versions = json.loads(engine.stdout.strip().splitlines()[-1]) if engine.returncode == 0 else {}
    return {
        "device": f"{len(names)}x {names[0]}" if names else "unknown",
        "driver": smi.stdout.splitlines()[0].split(",")[1].strip() if "," in smi.stdout else None,
        "cuda": versions.get("cuda"),
        "torch": versions.get("torch"),
        "vllm": versions.get("vllm"),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }


def step_captures(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    taken = {}
    for name, argv in NVIDIA_SMI_CAPTURES.items():
        result = run(argv, timeout=60)
        (work / "captures").mkdir(exist_ok=True)
        (work / "captures" / name).write_text(result.stdout)
        taken[name] = result.returncode
    return {"captures": taken}


def step_doctor(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    home = work / "home-doctor"
    result = sm120(home, args.vllm_python, "doctor", "--json", timeout=300)
    try:
        document = json.loads(result.stdout)
        single = isinstance(document, dict)
    except json.JSONDecodeError:
        document, single = None, False
    gpus = [
        f.get("message")
        for f in (document or {}).get("findings", [])
        if str(f.get("id", "")).startswith("gpu")
    ]
    return {"doctor_json_ok": single, "doctor_exit": result.returncode, "doctor_gpu": gpus}


# ---- launch and bench --------------------------------------------------------------------


def tiny_model(args: argparse.Namespace, work: Path) -> Path:
    from sm120.engine.tiny_model import ensure_tiny_model

    return ensure_tiny_model(Path(args.vllm_python), work / "tiny", log)


def bare_ready(
    args: argparse.Namespace, model: Path, cache: Path, key: str, log: Path | None = None
) -> float:
    request = PlanRequest(recipe="tiny", variants=("gpu",), model_dir=str(model), sets=LAUNCH_SETS)
    return bare_engine.bare_ready(args.vllm_python, request, cache, key, log)


# The bench compares prefill, so the prefix cache is off (benchmarks/bench_vs_vllm.py).
LAUNCH_SETS = ("enable-prefix-caching=false",)
# The bench's deployment takes a step budget above its longest prompt: vLLM's random prompts
# come out a token or two long at times (14 of 32 at 8,192 tokens on the tiny tokenizer), and
# at the recipe's 8,192 those need a second engine step before their first token, which ours
# (exact lengths) never do; an H100 run read vLLM's median TTFT at 8,192 ~6 ms above ours.
# And it captures CUDA graphs for steps of up to 1,024 tokens. With the recipe's 16 sequences
# vLLM captures only up to 32 tokens, so a 256- or 768-token prefill ran its 32 layers without
# a graph, launched kernel by kernel from Python: its TTFT was the host CPU's launch speed
# (256 and 768 tokens both 22-44 ms on an H200, in stretches that came and went within a run,
# whichever client measured; run 25), not the GPU's, and no 5% comparison can be read off that.
BENCH_SETS = (
    "max-num-batched-tokens=16384",
    'compilation-config={"max_cudagraph_capture_size": 1024}',
)
# One fixed key for every start of both sides: vLLM hashes VLLM_API_KEY into its compile-cache
# key, so a new key per start would compile anew each time (a deployment keeps its key).
BENCH_KEY = "gpu-proof-fixed-key"


def launch_args(model: Path, port: int, extra_sets: tuple[str, ...] = ()) -> tuple[str, ...]:
    sets = [item for setting in (*LAUNCH_SETS, *extra_sets) for item in ("--set", setting)]
    return (
        "launch", "tiny", "-V", "gpu", "--port", str(port), "--model-dir", str(model),
        "--api-key", BENCH_KEY, *sets,
    )  # fmt: skip


def sm120_ready(
    args: argparse.Namespace,
    model: Path,
    cache: Path,
    home: Path,
    log: Path | None = None,
    tree: Path = REPO,
    facts: dict[str, Any] | None = None,
) -> tuple[float, dict[str, float]]:
    """Seconds from `sm120 launch` to its READY line (the banner's first line, printed once the
    smoke test answered), and where the whole command's time went: before the engine was
    spawned (CLI start, preflight, plan), spawn to exit (the engine, the wait, the smoke test,
    the monitor's start and the banner), and the command's exit; and the CPU seconds the
    command itself used (user + system), which its wait loop would inflate."""
    env = {**sm120_env(home, args.vllm_python, tree), "VLLM_CACHE_ROOT": str(cache)}
    argv = [sys.executable, "-m", "sm120", *launch_args(model, free_port())]
    began_epoch, started = time.time(), time.perf_counter()
    launched = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    ready_at, stdout = None, []
    assert launched.stdout is not None
    for line in launched.stdout:
        stdout.append(line)
        if ready_at is None and line.startswith("READY"):
            ready_at = time.perf_counter() - started
    stderr = launched.stderr.read() if launched.stderr else ""
    _, status, usage = os.wait4(launched.pid, 0)
    launched.returncode = os.waitstatus_to_exitcode(status)
    took = time.perf_counter() - started
    split = _launch_split(home, "".join(stdout), began_epoch, took)
    split["exit_s"] = round(took, 2)
    split["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 2)
    if facts is not None:
        # The engine's API process while it still runs: launch_gap.py compares its scheduling
        # facts and environment with a bare start's.
        with contextlib.suppress(OSError, ValueError, KeyError):
            state = json.loads((home / "deployments" / "tiny" / "state.json").read_text())
            facts["spawned_at"] = float(state["started_at"])
            facts.update(bare_engine.process_facts(int(state["engine_pid"])))
    if log is not None:
        served = home / "deployments" / "tiny" / "logs" / "serve.log"
        if served.exists():
            log.write_bytes(served.read_bytes())
    run([sys.executable, "-m", "sm120", "stop"], env=env, timeout=300)
    if launched.returncode != 0 or ready_at is None:
        raise RuntimeError(f"sm120 launch failed: {stderr[-1500:]}")
    return ready_at, split


def _launch_split(home: Path, banner: str, began_epoch: float, took: float) -> dict[str, float]:
    state_file = home / "deployments" / "tiny" / "state.json"
    try:
        spawned = float(json.loads(state_file.read_text())["started_at"]) - began_epoch
    except (OSError, ValueError, KeyError):
        return {}
    waited = re.search(r"waiting (\d+)s", banner)
    split = {"before_spawn_s": round(spawned, 2), "spawn_to_exit_s": round(took - spawned, 2)}
    if waited:
        split["waiting_s"] = float(waited.group(1))
    return split


def step_launch(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model = tiny_model(args, work)
    cache = work / "vllm-cache"
    other: Path | None = args.compare_tree
    # Both sides start once before the pairs: each fills its own first-run caches (compile
    # cache entry, bytecode, the page cache), so the pairs compare warm with warm.
    logs = work / "launch-logs"
    logs.mkdir(exist_ok=True)
    log("priming: one bare start, then one sm120 start")
    first = bare_ready(args, model, cache, BENCH_KEY, logs / "bare-0.log")
    first_sm120, _ = sm120_ready(args, model, cache, work / "home-ready", logs / "sm120-0.log")
    if other is not None:
        sm120_ready(args, model, cache, work / "home-other", logs / "other-0.log", tree=other)
    ours: list[float] = []
    bare: list[float] = []
    theirs: list[float] = []
    splits: list[dict[str, float]] = []
    their_splits: list[dict[str, float]] = []
    sides = ("sm120", "bare") if other is None else ("sm120", "bare", "other")
    for pair in range(1, args.launch_pairs + 1):
        # Each side goes first in turn, so a drift over the run falls on all of them alike.
        shift = (pair - 1) % len(sides)
        for which in sides[shift:] + sides[:shift]:
            if which == "sm120":
                home = work / "home-ready"
                took, split = sm120_ready(args, model, cache, home, logs / f"sm120-{pair}.log")
                ours.append(took)
                splits.append(split)
            elif which == "other":
                assert other is not None
                took, split = sm120_ready(
                    args, model, cache, work / "home-other", logs / f"other-{pair}.log", other
                )
                theirs.append(took)
                their_splits.append(split)
            else:
                bare.append(bare_ready(args, model, cache, BENCH_KEY, logs / f"bare-{pair}.log"))
        compared = f", other {theirs[-1]:.1f} s {their_splits[-1]}" if theirs else ""
        log(f"pair {pair}: sm120 {ours[-1]:.1f} s {splits[-1]}, bare {bare[-1]:.1f} s{compared}")
        # Written after every pair: a call cut short by the device's time limit keeps its pairs.
        so_far = {"pairs_done": pair, "sm120_s": ours, "bare_s": bare, "sm120_split_s": splits}
        if other is not None:
            so_far |= {"other_tree": str(other), "other_s": theirs, "other_split_s": their_splits}
        (args.out / f"launch-pairs-{args.label}.json").write_text(json.dumps(so_far, indent=2))
    with tarfile.open(Path(args.out) / f"launch-logs-{args.label}.tgz", "w:gz") as archive:
        archive.add(logs, arcname="launch-logs")
    ready, bare_s = statistics.median(ours), statistics.median(bare)
    found: dict[str, Any] = {
        "launch": {
            "ready_s": round(ready, 2),
            "bare_ready_s": round(bare_s, 2),
            "ratio": round(ready / bare_s, 3),
            "pairs": args.launch_pairs,
            "ready_samples_s": [round(x, 2) for x in ours],
            "bare_samples_s": [round(x, 2) for x in bare],
            "sm120_split_s": splits,
            "cold_bare_ready_s": round(first, 2),
            "first_sm120_ready_s": round(first_sm120, 2),
        }
    }
    if other is not None:
        found["launch"]["compare_tree"] = {
            "tree": str(other),
            "ready_s": round(statistics.median(theirs), 2),
            "ratio": round(statistics.median(theirs) / bare_s, 3),
            "ready_samples_s": [round(x, 2) for x in theirs],
            "split_s": their_splits,
        }
    # The deployment the bench measures: launched, chatted with, status read; left up.
    home = work / "home"
    env = {**sm120_env(home, args.vllm_python), "VLLM_CACHE_ROOT": str(cache)}
    argv = launch_args(model, free_port(), BENCH_SETS)
    launched = run([sys.executable, "-m", "sm120", *argv], env=env)
    if launched.returncode != 0:
        raise RuntimeError(f"sm120 launch failed: {launched.stderr[-1500:]}")
    chat = run([sys.executable, "-m", "sm120", "chat", "--max-tokens", "16", "hello"], env=env)
    status = run([sys.executable, "-m", "sm120", "status", "--json"], env=env)
    found["launch"]["chat_ok"] = chat.returncode == 0 and bool(chat.stdout.strip())
    found["launch"]["status_ok"] = status.returncode == 0 and '"running"' in status.stdout
    found["launch"]["banner"] = launched.stdout.strip().splitlines()[-8:]
    return found


# The bench's model. At the tiny model's 10-25 ms TTFT, each client's own sub-millisecond
# costs (its HTTP stack, the prompt's text) are several percent of what is measured; a
# 1.1B-parameter Llama of the same tokenizer, with vLLM's dummy weights, puts the server's work
# in front. Both tools measure the same deployment either way.
BENCH_SHAPES: dict[str, dict[str, int] | None] = {
    "tiny": None,
    "1b": {
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 16,
        "intermediate_size": 8192,
    },
    # Llama-3-8B's shape: decode ~16 GB of weights a step and prefill in the hundreds of ms at
    # 8,192 tokens, so the GPU, not either client, sets the figures.
    "8b": {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 32,
        "intermediate_size": 14336,
    },
}


def bench_model(args: argparse.Namespace, work: Path) -> Path:
    tiny = tiny_model(args, work)
    shape = BENCH_SHAPES[args.bench_model]
    if shape is None:
        return tiny
    dest = work / f"bench-{args.bench_model}"
    dest.mkdir(exist_ok=True)
    # Everything but the weights (tokenizer, chat template): vLLM's dummy loader makes those.
    for item in tiny.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copyfile(item, dest / item.name)
    config = {**json.loads((tiny / "config.json").read_text()), **shape}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def step_bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from sm120.measure.target import target_for_deployment

    home = work / "home"
    tiny = args.bench_model == "tiny"
    # The launch step leaves a tiny deployment up; without that step, or for another model,
    # the bench launches its own.
    if not tiny or not (home / "deployments" / "tiny").exists():
        if not tiny:
            # The launch step's tiny deployment (if any) makes way for the bench's model.
            run([sys.executable, "-m", "sm120", "stop"], env=sm120_env(home, args.vllm_python))
            home = work / "home-bench"
        env = {**sm120_env(home, args.vllm_python), "VLLM_CACHE_ROOT": str(work / "vllm-cache")}
        sets = BENCH_SETS if tiny else ("load-format=dummy", *BENCH_SETS)
        argv = launch_args(bench_model(args, work), free_port(), sets)
        launched = run([sys.executable, "-m", "sm120", *argv], env=env)
        if launched.returncode != 0:
            raise RuntimeError(f"sm120 launch of the bench model failed: {launched.stderr[-1500:]}")
    os.environ.update(sm120_env(home, args.vllm_python))
    so_far = args.out / f"bench-rounds-{args.label}.json"

    def keep(samples: dict[str, dict[str, list[float]]]) -> None:
        # Written after every round: a call cut short by the device's time limit keeps them.
        so_far.write_text(json.dumps(samples, indent=2))

    try:
        target = target_for_deployment(None)
        samples: dict[str, Any] = {}
        positions: dict[str, Any] = {}
        if args.bench_rounds:
            samples, positions = run_rounds(
                target,
                home,
                rounds=args.bench_rounds,
                lengths=LENGTHS,
                decode_tokens=128,
                requests=args.bench_requests,
                vllm_python=args.vllm_python,
                report=log,
                prompts=args.bench_prompts,
                after_round=keep,
            )
        pairs = request_pairs(args) if args.bench_pairs else {}
        probe = short_ttft_probe(args, home) if args.bench_probe else None
        capture_metrics(target.base_url, target.api_key, work)
    finally:
        capture_engine_log(home, work)
        run([sys.executable, "-m", "sm120", "stop"], env=sm120_env(home, args.vllm_python))
    found: dict[str, Any] = {}
    if probe is not None:
        found["short_ttft_probe"] = probe
    if pairs:
        found["request_pairs"] = pairs
    if args.bench_rounds:
        shape = BENCH_SHAPES[args.bench_model]
        served = "tiny" if shape is None else f"{args.bench_model}: Llama {shape}, dummy weights"
        found["bench"] = {
            **bench_summary(samples, args.bench_rounds),
            "model": served,
            "server_sets": list(BENCH_SETS),
            "prompts": args.bench_prompts or BenchOptions().prompts,
            "ttft_ms_by_position": positions,
        }
    return found


def short_ttft_probe(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    """benchmarks/short_ttft_probe.py on the bench's deployment: its summary, each line
    logged as it comes."""
    out = args.out / f"short-ttft-probe-{args.label}.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "short_ttft_probe.py")]
    argv += ["--vllm-python", args.vllm_python, "--rounds", str(args.bench_probe)]
    argv += ["--out", str(out)]
    with subprocess.Popen(
        argv,
        env={**os.environ, **sm120_env(home, args.vllm_python)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as probe:
        assert probe.stdout is not None
        for line in probe.stdout:
            log(line.rstrip())
    if probe.returncode != 0 or not out.is_file():
        raise RuntimeError(f"short_ttft_probe.py exited {probe.returncode}")
    summary: dict[str, Any] = json.loads(out.read_text())["summary"]
    return summary


# Each request's own output tokens in the pairs: the prefill points' count, so a pair's TTFTs
# are those the bench's prefill figures are made of.
PAIR_TOKENS = 8


def request_pairs(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's request function against ours, alternating request by request on one server
    (benchmarks/request_ab.py): what is left between the tools once ordering, process start
    and the prompts' making are the same for both. Per length, medians and the median of
    each pair's own ratio."""
    found: dict[str, Any] = {}
    for length in LENGTHS:
        log(f"request pairs: {args.bench_pairs} at {length} tokens")
        sides = request_level(
            length, argparse.Namespace(pairs=args.bench_pairs, decode_tokens=PAIR_TOKENS)
        )
        ours = [float(r["ttft"]) for r in sides["sm120"]]
        theirs = [float(r["ttft"]) for r in sides["vllm"]]
        each = [a / b for a, b in zip(ours, theirs, strict=True) if b]
        found[str(length)] = {
            "pairs": len(each),
            "median_ttft_s": {
                "sm120": round(statistics.median(ours), 5),
                "vllm": round(statistics.median(theirs), 5),
            },
            "ratio_of_medians": round(statistics.median(ours) / statistics.median(theirs), 3),
            "median_pair_ratio": round(statistics.median(each), 3),
        }
        log(f"request pairs at {length}: {found[str(length)]}")
    return found


def bench_summary(samples: dict[str, dict[str, list[float]]], rounds: int) -> dict[str, Any]:
    def ratio(name: str) -> dict[str, Any]:
        ours, theirs = samples["sm120"][name], samples["vllm"][name]
        low, high = ratio_interval(ours, theirs)
        mine, their = statistics.median(ours), statistics.median(theirs)
        return {
            "ratio": round(mine / their, 3),
            "interval90": [round(low, 3), round(high, 3)],
            "sm120": round(mine, 4),
            "vllm": round(their, 4),
        }

    decode = ratio("decode tok/s")
    prefill = {str(n): ratio(f"prefill tok/s @ {n}") for n in LENGTHS}
    ttft = {str(n): ratio(f"median TTFT s @ {n}") for n in LENGTHS}
    return {
        "rounds": rounds,
        "decode_ratio": decode["ratio"],
        "prefill_ratio": {n: p["ratio"] for n, p in prefill.items()},
        "median_ttft_ratio": {n: t["ratio"] for n, t in ttft.items()},
        "detail": {"decode": decode, "prefill": prefill, "median_ttft": ttft},
    }


def capture_metrics(base_url: str, key: str | None, work: Path) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    text = httpx.get(f"{base_url}/metrics", headers=headers, timeout=30).text
    (work / "captures").mkdir(exist_ok=True)
    (work / "captures" / "metrics.txt").write_text(text)


def capture_engine_log(home: Path, work: Path) -> None:
    for log_file in sorted(home.glob("deployments/*/logs/serve.log")):
        (work / "captures").mkdir(exist_ok=True)
        (work / "captures" / "engine.log").write_text(log_file.read_text(errors="replace"))


# ---- planner against the engine's own allocator -----------------------------------------


def engine_kv_tokens(
    args: argparse.Namespace, model: Path, engine_args: list[str], log_path: Path
) -> int:
    """Serve `model` with dummy weights until the engine prints its KV pool, then stop it.
    benchmarks/dummy_site runs the post-load step vLLM's dummy loader skips (DeepSeek-V4)."""
    argv = [
        args.vllm_python, "-m", "vllm.entrypoints.cli.main", "serve", str(model),
        "--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
        "--host", "127.0.0.1", "--port", str(free_port()), *engine_args,
    ]  # fmt: skip
    site = str(REPO / "benchmarks" / "dummy_site")
    env = {
        **os.environ,
        "SM120_DUMMY_POST_LOAD": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")])),
    }
    with log_path.open("w") as sink:
        engine = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    deadline = time.monotonic() + args.planner_timeout
    try:
        while time.monotonic() < deadline:
            found = KV_LINE.search(log_path.read_text(errors="replace"))
            if found:
                return int(found["tokens"].replace(",", ""))
            if engine.poll() is not None:
                break
            time.sleep(1)
        raise RuntimeError(
            "no 'GPU KV cache size' line: " + root_cause(log_path.read_text(errors="replace"))
        )
    finally:
        stop_group(engine)


# The exception line of a Python traceback, under any process prefix vLLM adds.
EXCEPTION_LINE = re.compile(
    r"^(?:\([^)]*\) )?(?:ERROR [^\]]*\] )?(?P<line>[\w.]*(?:Error|Exception)\b.*)$"
)


def root_cause(log_text: str) -> str:
    """The first exception a failed start raised (the engine core's, not the API server's
    "see root cause above"), with the failing statement for a bare assertion; else the log's
    last line."""
    previous = ""
    for raw in log_text.splitlines():
        found = EXCEPTION_LINE.match(raw.strip())
        if found and "See root cause above" not in found["line"]:
            line = found["line"]
            return (f"{line}: {previous}" if line.endswith("Error") and previous else line)[:300]
        text = raw.strip()
        if text and "^^^" not in text:
            previous = re.sub(r"^(?:\([^)]*\) )?(?:ERROR [^\]]*\] )?", "", text).strip()
    lines = [line for line in log_text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "the engine printed nothing"


def stop_group(engine: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL after 5 s: a dummy engine holds nothing worth a clean stop (seen:
    vLLM 0.26 ignoring SIGTERM for a minute once its API server has no tokenizer)."""
    if engine.poll() is None:
        os.killpg(engine.pid, signal.SIGTERM)
        try:
            engine.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait()


def plan_tokens(
    args: argparse.Namespace, case: dict[str, Any], model: Path, tp: int, dcp: int = 1
) -> Any:
    home = Path(tempfile.mkdtemp(prefix="plan-home-"))
    settings = [
        f"tensor-parallel-size={tp}", f"decode-context-parallel-size={dcp}",
        f"block-size={case['block']}", f"kv-cache-dtype={case['kv_dtype']}",
        f"max-num-batched-tokens={case['mnbt']}", "speculative-config=null",
        f"image.engine_version={PROOF_ENGINE_VERSION}",
    ]  # fmt: skip
    if case["recipe"] == "glm52":
        # Upstream vLLM builds an indexer only on the layers that compute their own top-k;
        # the recipe's b12x image builds one on every layer.
        settings.append("model.dims.dsa_indexer_cache=full_layers")
    argv = [
        "plan", case["recipe"], "--gpus", str(tp), "--kv-memory-gib", str(PLANNER_KV_GIB),
        "--model-dir", str(model), "--max-model-len", str(case["context"]), "--json",
    ]  # fmt: skip
    if case["recipe"] == "dsv4":
        # the proof's DeepSeek-V4 plans start from PR #41834's engine command (the former
        # default): the r7 default is a launcher route, whose flags --set cannot reach
        argv += ["-V", "pr41834"]
    for setting in settings:
        argv += ["--set", setting]
    result = sm120(home, args.vllm_python, *argv, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"sm120 plan failed: {result.stderr.strip()[-800:]}")
    return json.loads(result.stdout)


def chosen(case: dict[str, Any], only: tuple[str, ...]) -> bool:
    """--only names a recipe ("glm52") or a recipe and KV dtype ("glm47:fp8")."""
    return case["recipe"] in only or f"{case['recipe']}:{case['kv_dtype']}" in only


def planner_runs(args: argparse.Namespace) -> list[tuple[dict[str, Any], int, int]]:
    """(case, TP, DCP) in the order they run: every case at every TP, then the MLA cases
    again with decode context parallel across the largest TP, where --dcp asks for it."""
    cases = [c for c in PLANNER_CASES if not args.only or chosen(c, args.only)]
    runs = [(case, tp, 1) for tp in args.tp for case in cases]
    if args.dcp > 1:
        runs += [(case, max(args.tp), args.dcp) for case in cases if case["recipe"] == "glm52"]
    return runs


def step_planner(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rows = []
    for case, tp, dcp in planner_runs(args):
        row: dict[str, Any] = {
            "recipe": case["recipe"],
            "tp": tp,
            "kv_dtype": case["kv_dtype"],
            "max_num_batched_tokens": case["mnbt"],
            "block_size": case["block"],
            "max_model_len": case["context"],
            "kv_cache_memory_bytes": PLANNER_KV_GIB * GIB,
        }
        if dcp > 1:
            row["dcp"] = dcp
        model = write_reduced(case["recipe"], work / "reduced" / case["recipe"])
        row["architecture"] = json.loads((model / "config.json").read_text())["architectures"][0]
        engine_args = [
            "--tensor-parallel-size", str(tp), "--decode-context-parallel-size", str(dcp),
            "--kv-cache-memory-bytes", str(PLANNER_KV_GIB * GIB),
            "--max-model-len", str(case["context"]),
            "--max-num-batched-tokens", str(case["mnbt"]),
            "--block-size", str(case["block"]),
            "--kv-cache-dtype", case["kv_dtype"], "--max-num-seqs", "4",
        ]  # fmt: skip
        label = f"{case['recipe']}-{case['kv_dtype']}-tp{tp}-dcp{dcp}"
        (work / "captures").mkdir(exist_ok=True)
        try:
            log(f"planner: serving {label}")
            row["vllm_tokens"] = engine_kv_tokens(
                args, model, engine_args, work / "captures" / f"planner-{label}.log"
            )
            planned = plan_tokens(args, case, model, tp, dcp)
            row["plan_tokens"] = planned["kv_pool_tokens"]
            row["plan_layout"] = planned["kv_layout"]
            row["ratio"] = round(row["plan_tokens"] / row["vllm_tokens"], 4)
            log(f"planner {label}: vLLM {row['vllm_tokens']:,}, plan {row['plan_tokens']:,}")
        except Exception as exc:  # one architecture failing must not lose the others
            row["error"] = str(exc)[-1200:]
            log(f"planner {label}: {row['error']}")
        rows.append(row)
    return {"planner": rows}


# ---- the run and the merge ---------------------------------------------------------------

STEP_FUNCTIONS = {
    "facts": step_facts,
    "captures": step_captures,
    "doctor": step_doctor,
    "launch": step_launch,
    "bench": step_bench,
    "planner": step_planner,
}


def pack_captures(work: Path, out: Path, label: str) -> None:
    folder = work / "captures"
    if not folder.is_dir():
        return
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(folder.iterdir()):
            archive.add(path, arcname=path.name)
    (out / f"captures-{label}.tgz").write_bytes(buffer.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"))
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--label", default="run")
    parser.add_argument("--tp", default="1", help="planner: TP sizes, e.g. 2,4")
    parser.add_argument("--dcp", type=int, default=1, help="planner: also GLM-5.2 at this DCP")
    parser.add_argument(
        "--only", default="", help="planner: only these cases, e.g. glm52,glm47:fp8"
    )
    parser.add_argument("--launch-pairs", type=int, default=4)
    parser.add_argument(
        "--compare-tree",
        type=Path,
        help="launch: also time sm120 from this checkout in every pair (an A/B of two commits)",
    )
    parser.add_argument("--bench-rounds", type=int, default=6)
    parser.add_argument("--bench-requests", type=int, default=16)
    parser.add_argument("--bench-model", choices=sorted(BENCH_SHAPES), default="tiny")
    parser.add_argument(
        "--bench-probe",
        type=int,
        default=0,
        help="bench: also this many rounds of benchmarks/short_ttft_probe.py",
    )
    parser.add_argument(
        "--bench-pairs",
        type=int,
        default=0,
        help="bench: also this many request-level pairs per prompt length (request_ab.py)",
    )
    parser.add_argument(
        "--bench-prompts",
        choices=("vllm-random", "text-pool"),
        help="how sm120 makes its bench prompts (sm120 bench's default when not given)",
    )
    parser.add_argument("--planner-timeout", type=float, default=420)
    parser.add_argument("--merge", nargs="+", type=Path, help="combine gpu-proof-*.json files")
    parser.add_argument("--logs", type=Path, help="with --merge: the captured planner logs")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, args.out, args.logs)
        return
    if not args.vllm_python:
        raise SystemExit("pass --vllm-python (the CUDA vLLM's python) or set VLLM_PYTHON")
    args.only = tuple(filter(None, args.only.split(",")))
    args.tp = tuple(int(n) for n in args.tp.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-proof-"))
    result: dict[str, Any] = {"label": args.label, "machine": device_name(), "steps": {}}
    for step in args.steps.split(","):
        log(f"step {step}")
        started = time.perf_counter()
        try:
            result.update(STEP_FUNCTIONS[step](args, work))
            result["steps"][step] = "ok"
        except Exception as exc:  # record and go on: one call of device time is precious
            result["steps"][step] = f"failed: {str(exc)[-1500:]}"
            log(f"step {step} failed: {exc}")
        log(f"step {step} took {time.perf_counter() - started:.0f} s")
        (args.out / f"gpu-proof-{args.label}.json").write_text(json.dumps(result, indent=2))
    pack_captures(work, args.out, args.label)
    print(json.dumps(result, indent=2))


# Figures a later run measures again with a better method or tool: the launch timing (to the
# READY line), the bench (its prompts built as vLLM's random dataset builds them), the
# request-level pairs and the short-prompt probe.
LATER_REPLACES = ("launch", "bench", "request_pairs", "short_ttft_probe")


def merge(parts: list[Path], out: Path, logs: Path | None = None) -> None:
    """Facts and figures from the first part that has them, except the launch timing and the
    bench, where a later measurement replaces an earlier one (as a later planner row of the
    same case -- recipe, KV dtype, TP, DCP -- replaces an earlier row); and `runs`, which part
    ran what on which machine. With `logs` (the captured engine logs), a failed
    row names the exception its engine raised."""
    merged: dict[str, Any] = {"runs": [], "planner": []}
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for part in parts:
        data = json.loads(part.read_text())
        if "world" in data and "backend" in data:  # a `sm120 doctor --p2p --json` document
            merged.setdefault("doctor_p2p", []).append(p2p_summary(part.stem, data))
            continue
        if part.suffix == ".facts":  # a copy kept for its facts alone (see docs/gpu-proof.md)
            data.pop("planner", None)
        label = data.get("label", part.stem)
        merged["runs"].append(
            {
                "label": label,
                "device": data.get("device") or data.get("machine"),
                "steps": data.get("steps", {}),
                **({"note": data["note"]} if "note" in data else {}),
            }
        )
        for key, value in data.items():
            if key == "planner":
                for row in value:
                    case = (row["recipe"], row["kv_dtype"], row["tp"], row.get("dcp", 1))
                    rows.pop(case, None)  # re-inserted last: the table keeps run order
                    rows[case] = row
            elif key in LATER_REPLACES:
                merged[key] = {**value, "run": label}
                if key == "bench" and "request_pairs" in value:
                    # run 23 recorded its pairs inside its bench; a later bench has none
                    merged["request_pairs"] = {**merged[key].pop("request_pairs"), "run": label}
                merged[key].pop("ttft_ms_by_position", None)  # in the run's own file
            elif key not in ("label", "steps", "machine", "note"):
                merged.setdefault(key, value)
    merged["planner"] = list(rows.values())
    if logs is not None:
        for row in merged["planner"]:
            label = f"{row['recipe']}-{row['kv_dtype']}-tp{row['tp']}-dcp{row.get('dcp', 1)}"
            log_file = logs / f"planner-{label}.log"
            if "error" in row and log_file.is_file():
                row["error"] = "no 'GPU KV cache size' line: " + root_cause(
                    log_file.read_text(errors="replace")
                )
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-proof.json").write_text(json.dumps(merged, indent=2) + "\n")
    (out / "gpu-proof.md").write_text(markdown(merged))
    print(markdown(merged))


def p2p_summary(label: str, doc: dict[str, Any]) -> dict[str, Any]:
    """What `sm120 doctor --p2p --json` found, in a few fields: pairs verified, their
    bandwidth range, and the all-reduce."""
    copies = [step for step in doc["steps"] if step["step"].startswith("copy ")]
    rates = [step["gbps"] for step in copies if step.get("gbps")]
    reduce = next((step for step in doc["steps"] if step["step"] == "all-reduce"), None)
    return {
        "label": label,
        "ok": doc["ok"],
        "gpus": doc["world"],
        "backend": doc["backend"],
        "pairs_verified": sum(1 for step in copies if step["ok"]),
        "pairs": len(copies),
        "gbps_range": [min(rates), max(rates)] if rates else None,
        "all_reduce_ok": bool(reduce and reduce["ok"]),
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# GPU proof",
        "",
        f"{data.get('device')}, driver {data.get('driver')}, CUDA {data.get('cuda')}, "
        f"torch {data.get('torch')}, vLLM {data.get('vllm')}, {data.get('date')}. "
        "Written by `benchmarks/gpu_proof.py`; see docs/gpu-proof.md.",
        "",
    ]
    for run in data.get("runs", []):
        steps = ", ".join(f"{k} {v}" if v != "ok" else k for k, v in run["steps"].items())
        lines.append(
            f"- {run['label']}: {run['device'] or 'the machine of the run above'}; {steps}"
        )
    lines.append("")
    launch = data.get("launch")
    if launch:
        lines += [
            "| time to READY (warm) | sm120 launch | bare vllm serve | ratio | chat |",
            "|---|---|---|---|---|",
            f"| median of {launch['pairs']} pairs ({launch.get('run', 'run')}) | "
            f"{launch['ready_s']} s | "
            f"{launch['bare_ready_s']} s | {launch['ratio']} | {launch.get('chat_ok')} |",
            "",
        ]
        before = [split["before_spawn_s"] for split in launch.get("sm120_split_s", []) if split]
        if before:
            lines += [
                f"sm120's own work before it spawns the engine (CLI start, plan, preflight): "
                f"median {statistics.median(before)} s of the {launch['ready_s']} s.",
                "",
            ]
    for probe in data.get("doctor_p2p", []):
        rates = probe["gbps_range"] or ["-", "-"]
        lines += [
            f"`sm120 doctor --p2p` on {probe['gpus']} GPUs ({probe['label']}): "
            f"{probe['pairs_verified']} of {probe['pairs']} peer copies verified at "
            f"{rates[0]}-{rates[1]} GB/s, {probe['backend']} all-reduce "
            f"{'correct' if probe['all_reduce_ok'] else 'FAILED'}.",
            "",
        ]
    bench = data.get("bench")
    if bench:
        detail = bench["detail"]
        lines += [
            f"| sm120 bench / vllm bench serve ({bench['rounds']} rounds"
            + (f" ({bench['run']})" if "run" in bench else "")
            # "8b: Llama {...shape...}, dummy weights": the name, the shape is in the run's file
            + f", model {bench.get('model', 'tiny').split(':')[0]}, "
            f"sm120 prompts {bench.get('prompts', 'text-pool')}"
            + "".join(f", --set {setting}" for setting in bench.get("server_sets", ()))
            + ") | ratio | 90% interval |",
            "|---|---|---|",
            f"| decode tok/s | {detail['decode']['ratio']} | {detail['decode']['interval90']} |",
        ]
        for n, point in detail["prefill"].items():
            lines.append(f"| prefill tok/s @ {n} | {point['ratio']} | {point['interval90']} |")
        for n, point in detail["median_ttft"].items():
            lines.append(f"| median TTFT @ {n} | {point['ratio']} | {point['interval90']} |")
        lines.append("")
    pairs = data.get("request_pairs")
    if pairs:
        lines += [
            f"| request level ({pairs['run']}): vLLM's request function against ours, "
            "alternating | pairs | median TTFT sm120 / vLLM | ratio of medians | "
            "median of each pair's ratio |",
            "|---|---|---|---|---|",
        ]
        for n, row in pairs.items():
            if n == "run":
                continue
            ttft = row["median_ttft_s"]
            lines.append(
                f"| {n} tokens | {row['pairs']} | {ttft['sm120'] * 1000:.2f} / "
                f"{ttft['vllm'] * 1000:.2f} ms | {row['ratio_of_medians']} | "
                f"{row['median_pair_ratio']} |"
            )
        lines.append("")
    probe = data.get("short_ttft_probe")
    if probe:
        lengths = [n for n in probe if n.isdigit()]
        ran = [c for c in CONDITION_NAMES if c in probe[lengths[0]]]
        lines += [
            f"| short-prompt probe ({probe['run']}), median TTFT | " + " | ".join(ran) + " |",
            "|---" * (len(ran) + 1) + "|",
        ]
        for n in lengths:
            row = probe[n]
            cells = [f"{row[c]['median_ms']} ms (x{row[c]['ratio_to_ours']})" for c in ran]
            lines.append(f"| {n} tokens | " + " | ".join(cells) + " |")
        clocks = probe.get("sm_mhz")
        if clocks:
            cells = [f"{clocks[c]:.0f} MHz" for c in ran]
            lines.append("| GPU SM clock | " + " | ".join(cells) + " |")
        lines.append("")
    rows = data.get("planner") or []
    if rows:
        lines += [
            "| recipe | architecture | TP | DCP | KV dtype | vLLM tokens | plan tokens | ratio |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            if "error" in row:
                lines.append(
                    f"| {row['recipe']} | {row.get('architecture')} | {row['tp']} | "
                    f"{row.get('dcp', 1)} | {row['kv_dtype']} | did not run: "
                    f"{row['error'][:160]} | | |"
                )
                continue
            lines.append(
                f"| {row['recipe']} | {row['architecture']} | {row['tp']} | {row.get('dcp', 1)} | "
                f"{row['kv_dtype']} | "
                f"{row['vllm_tokens']:,} | {row['plan_tokens']:,} | {row['ratio']} |"
            )
        lines.append("")
    lines.append(f"doctor --json is one JSON document: {data.get('doctor_json_ok')}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
