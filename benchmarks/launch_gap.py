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
environment, and splits the engine log by its own timestamps (spawn -> first API line ->
first EngineCore line -> server up), so a difference shows where it arises.

Run on the device after device-setup:
    /tmp/py benchmarks/launch_gap.py --vllm-python /tmp/py --out $OUT [--rounds 3]
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
from gpu_proof import BENCH_KEY, LAUNCH_SETS, log, sm120_ready, tiny_model  # noqa: E402

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
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
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

    log("priming: each side starts once (the first start compiles)")
    rows = [start(side, "prime") for side in sides]
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


if __name__ == "__main__":
    main()
