"""Where `sm120 launch`'s extra seconds over a bare `vllm serve` go, on the GPU device.

Three ways to start the same engine (the tiny model, the command line sm120 renders), each
timed from its start to the first chat answer, in rotating order:
  bare        `vllm serve` as a child of this script, its output to a file
  supervised  the same command under sm120's supervisor (`python -m
              sm120.engine.runtime.supervise`), its output through the supervisor's pipe:
              what `sm120 launch` spawns, without the command around it
  supervised-file  the same under the supervisor, the engine writing to its log file
              itself: the supervisor as parent without the pipe
  sm120       `sm120 launch tiny -V gpu` to its READY line
For every start it also records the API process's nice value, allowed CPUs, cgroup and
environment and, at READY, its process tree (each process's start, CPU seconds and run-queue
wait), and splits the engine log by its own timestamps (spawn -> first API line -> first
EngineCore line -> server up), so a difference shows where it arises.

Run on the device after device-setup:
    /tmp/py benchmarks/launch_gap.py --vllm-python /tmp/py --out $OUT [--rounds 3]
It writes OUT/launch-gap.json (every start) and OUT/gpu-proof-<label>.json, the part whose
launch figure `gpu_proof.py --merge` takes; `--summarise FILE` writes only that part.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bare_engine  # noqa: E402
from gpu_proof import (  # noqa: E402
    BENCH_KEY,
    LAUNCH_SETS,
    device_name,
    log,
    sm120_ready,
    tiny_model,
)

from sm120.plan.resolve import PlanRequest  # noqa: E402

SIDES = ("bare", "supervised", "supervised-file", "sm120")
SUPERVISOR: dict[str, Literal["pipe", "file"]] = {"supervised": "pipe", "supervised-file": "file"}
STAMP = re.compile(r"\((APIServer|EngineCore)[^)]*\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d)")


def log_marks(text: str, year: int) -> dict[str, float]:
    """Epoch seconds (whole seconds: the log's resolution) of the first API line, the first
    EngineCore line and the line that says the server is up."""
    marks: dict[str, float] = {}
    for line in text.splitlines():
        found = STAMP.search(line)
        if not found:
            continue
        when = datetime.strptime(f"{year}-{found.group(2)}", "%Y-%m-%d %H:%M:%S").timestamp()
        name = "api_first" if found.group(1) == "APIServer" else "core_first"
        marks.setdefault(name, when)
        if "Starting vLLM server" in line:
            marks.setdefault("server_up", when)
    return marks


def split(facts: dict[str, Any], log_path: Path) -> dict[str, float]:
    spawned = facts.get("spawned_at")
    if spawned is None or not log_path.exists():
        return {}
    marks = log_marks(log_path.read_text(errors="replace"), datetime.now().year)
    points = (
        ("spawn_to_api", "api_first"),
        ("api_to_core", "core_first"),
        ("core_to_up", "server_up"),
    )
    found: dict[str, float] = {}
    previous = spawned
    for name, mark in points:
        if mark in marks:
            found[name] = round(marks[mark] - previous, 1)
            previous = marks[mark]
    return found | tree_split(facts, marks)


def tree_split(facts: dict[str, Any], marks: dict[str, float]) -> dict[str, float]:
    """From the engine's process tree: when the API process spawned the EngineCore (10 ms
    resolution, unlike the log), how long the EngineCore took to its first line, and the CPU
    and run-queue wait all its processes used by READY."""
    tree = facts.get("tree") or []
    if not tree:
        return {}
    found = {
        "cpu_s": round(sum(p["cpu_s"] + p["children_cpu_s"] for p in tree), 1),
        "runqueue_wait_s": round(sum(p["runqueue_wait_s"] for p in tree), 1),
        "api_cpu_s": tree[0]["cpu_s"],
    }
    core = next((p for p in tree[1:] if "Engine" in p["name"]), None)
    if core is not None:
        found["core_cpu_s"] = core["cpu_s"]
        found["spawn_to_core_spawn"] = round(core["started_at"] - facts["spawned_at"], 2)
        if "core_first" in marks:
            found["core_spawn_to_core_first"] = round(marks["core_first"] - core["started_at"], 1)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", help="the CUDA vLLM's python (required to run)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--primes", type=int, default=2, help="untimed starts before the rounds")
    parser.add_argument("--label", default="launch-gap", help="names the gpu-proof part it writes")
    parser.add_argument(
        "--summarise",
        type=Path,
        metavar="LAUNCH_GAP_JSON",
        help="only write the gpu-proof part of an earlier run's launch-gap.json (with --machine)",
    )
    parser.add_argument("--machine", default="", help="with --summarise: the device it ran on")
    parser.add_argument(
        "--sides", default=",".join(SIDES), help="which starts to time, e.g. bare,supervised"
    )
    parser.add_argument(
        "--variant",
        default="gpu",
        help="the tiny recipe's variant for bare and the supervised sides ('' on a CPU vLLM; "
        "the sm120 side always launches -V gpu)",
    )
    args = parser.parse_args()
    if args.summarise:
        part = proof_part(json.loads(args.summarise.read_text()), args.label, args.machine)
        (args.out / f"gpu-proof-{args.label}.json").write_text(json.dumps(part, indent=2) + "\n")
        return
    if not args.vllm_python:
        parser.error("--vllm-python is required to run the starts")
    sides = tuple(side for side in args.sides.split(",") if side)
    work = Path(f"/tmp/launch-gap-{int(time.time())}")
    work.mkdir(parents=True)
    logs = work / "logs"
    logs.mkdir()
    model = tiny_model(args, work)
    cache = work / "vllm-cache"
    variants = (args.variant,) if args.variant else ()
    request = PlanRequest(recipe="tiny", variants=variants, model_dir=str(model), sets=LAUNCH_SETS)

    def start(side: str, tag: str) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        path = logs / f"{side}-{tag}.log"
        began = time.time()
        if side == "sm120":
            took, _ = sm120_ready(args, model, cache, work / "home", path, facts=facts)
        else:
            took = bare_engine.bare_ready(
                args.vllm_python, request, cache, BENCH_KEY, path,
                supervisor=SUPERVISOR.get(side), facts=facts,
            )  # fmt: skip
        facts.setdefault("spawned_at", began)
        row = {"side": side, "tag": tag, "ready_s": round(took, 2), **split(facts, path)}
        log(f"{side} {tag}: {json.dumps(row)}")
        return {**row, "facts": facts}

    # The first start compiles and the second still pays a one-off warm-up (run 19: 89 s,
    # 57 s, then 38 s), whichever side makes them; later starts are warm for every side.
    log(f"priming: {args.primes} starts before the timed rounds")
    rows = [start(sides[number % len(sides)], "prime") for number in range(args.primes)]
    for number in range(1, args.rounds + 1):
        shift = (number - 1) % len(sides)
        for side in sides[shift:] + sides[:shift]:
            rows.append(start(side, str(number)))
        (args.out / "launch-gap.json").write_text(json.dumps(rows, indent=2))
    timed = [row for row in rows if row["tag"] != "prime"]
    for side in sides:
        mine = [row["ready_s"] for row in timed if row["side"] == side]
        log(f"{side}: median {statistics.median(mine):.2f} s of {mine}")
    environments = {row["side"]: row["facts"].get("env", {}) for row in timed}
    bare_env = environments.get("bare", {})
    for side in sides[1:] if sides[:1] == ("bare",) else ():
        theirs = environments.get(side, {})
        differing = sorted(
            name for name in set(bare_env) | set(theirs) if bare_env.get(name) != theirs.get(name)
        )
        log(f"environment {side} vs bare differs in: {differing}")
        for name in differing:
            log(f"  {name}: bare={bare_env.get(name)!r} {side}={theirs.get(name)!r}")
    for row in timed[:3]:
        facts = row["facts"]
        log(f"{row['side']}: nice {facts.get('nice')} cpus {facts.get('cpus_allowed')}")
    (args.out / "launch-gap.json").write_text(json.dumps(rows, indent=2))
    if "sm120" in sides and "bare" in sides:
        part = proof_part(rows, args.label, device_name())
        (args.out / f"gpu-proof-{args.label}.json").write_text(json.dumps(part, indent=2))


def proof_part(rows: list[dict[str, Any]], label: str, machine: str) -> dict[str, Any]:
    """The run as a part for `gpu_proof.py --merge`: its launch figure is sm120's median time
    to READY over bare `vllm serve`'s, rounds in rotating order; every side's samples and the
    CPU seconds each start's engine used come along, since the engine's own start varies."""
    timed = [row for row in rows if row["tag"] != "prime"]
    sides: dict[str, dict[str, Any]] = {}
    for row in timed:
        side = sides.setdefault(row["side"], {"samples_s": [], "engine_cpu_s": []})
        side["samples_s"].append(row["ready_s"])
        side["engine_cpu_s"].append(row.get("cpu_s"))
    for side in sides.values():
        side["median_s"] = round(statistics.median(side["samples_s"]), 2)
    ready, bare = sides["sm120"]["median_s"], sides["bare"]["median_s"]
    return {
        "label": label,
        "machine": machine,
        "steps": {"launch": "ok"},
        "launch": {
            "ready_s": ready,
            "bare_ready_s": bare,
            "ratio": round(ready / bare, 3),
            "pairs": len(sides["sm120"]["samples_s"]),
            "ready_samples_s": sides["sm120"]["samples_s"],
            "bare_samples_s": sides["bare"]["samples_s"],
            # sm120's READY line comes only after its smoke test's chat answered.
            "chat_ok": True,
            "method": "benchmarks/launch_gap.py: rounds in rotating order, after priming starts",
            "sides": sides,
        },
    }


if __name__ == "__main__":
    main()
