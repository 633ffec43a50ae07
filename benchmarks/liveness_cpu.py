"""What "is the engine still running?" costs a launch's wait and the monitor, in one run: the
scan of every process that `members()` does against the leader-or-engine check that
`has_live_member()` does first, on a real supervised stand-in engine.

A launch's wait asks 20 times a second for the whole start (30-120 s on a GPU), the log
follower asks as often, and the monitor asks on every poll. The scan reads /proc/PID/stat of
every process on the machine, so its cost grows with the machine: `--extra N` starts N idle
processes to show a busier host (a GPU server with its engine's workers, a desktop). On an
H100 machine the `sm120 launch` process used 8.5-10 s of CPU over a 43 s start
(benchmarks/results/gpu-proof-runs/17-*.log), most of it in this scan.

Each path is timed by the CPU seconds of this process (resource.getrusage) over `--calls`
calls, and both must agree that the deployment runs, or the run fails.

Run: python benchmarks/liveness_cpu.py [--calls 2000] [--extra 0,300]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from sm120.engine.runtime.base import LaunchSpec
from sm120.engine.runtime.native import NativeRuntime, owned_group
from sm120.engine.runtime.processes import PROC

ENGINE = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
# The launch's wait and the log follower each ask every 50 ms.
ASKS_PER_SECOND = 2 * 20


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_call_us(check: Callable[[], bool], calls: int) -> float:
    began = cpu_seconds()
    for _ in range(calls):
        if not check():
            raise SystemExit("the deployment should be running: the two paths disagree")
    return (cpu_seconds() - began) / calls * 1e6


def process_count() -> int:
    return sum(1 for entry in PROC.iterdir() if entry.name.isdigit())


def measure(calls: int, extra: int, folder: Path) -> tuple[int, float, float]:
    idle = [subprocess.Popen(["sleep", "600"]) for _ in range(extra)]
    script = folder / "engine.py"
    script.write_text(ENGINE)
    spec = LaunchSpec(
        name=f"liveness-{extra}",
        recipe="bench",
        argv=(sys.executable, str(script)),
        env={},
        host="127.0.0.1",
        port=18000,
        plan_hash="bench",
        served_model_name="bench",
        model_dir=None,
        api_key_file=None,
    )
    runtime = NativeRuntime()
    state = runtime.start(spec, folder / f"engine-{extra}.log")
    try:
        group = owned_group(state)
        scan = per_call_us(lambda: bool(group.members()), calls)
        quick = per_call_us(group.has_live_member, calls)
        return process_count(), scan, quick
    finally:
        runtime.stop(state, timeout=5)
        for process in idle:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--extra", default="0,300", help="idle processes to add, per row")
    args = parser.parse_args()
    print(
        f"{'processes':>9}  {'scan µs/call':>12}  {'check µs/call':>13}  {'ratio':>6}  "
        f"{'scan CPU %/core':>15}  {'check CPU %/core':>16}"
    )
    with tempfile.TemporaryDirectory(prefix="liveness-") as scratch:
        for extra in (int(n) for n in args.extra.split(",")):
            processes, scan, quick = measure(args.calls, extra, Path(scratch))
            # CPU share at the rate a launch's wait asks (wait loop + log follower).
            print(
                f"{processes:>9}  {scan:>12.1f}  {quick:>13.1f}  {scan / quick:>6.1f}  "
                f"{scan * ASKS_PER_SECOND / 1e4:>15.2f}  {quick * ASKS_PER_SECOND / 1e4:>16.3f}"
            )


if __name__ == "__main__":
    main()
