"""sm120's own time before it spawns the engine: `sm120 launch tiny` from process start to the
moment it would start the engine (the runtime's start is replaced by a stop-watch), for this
tree against another revision, alternating, on this machine. This is the part of time to READY
that sm120 adds to a bare `vllm serve` (benchmarks/gpu_proof.py measures the whole on a GPU).

Run: VLLM_PYTHON=... python benchmarks/launch_prespawn.py [--against REV] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sm120.engine.tiny_model import ensure_tiny_model

REPO = Path(__file__).resolve().parents[1]

# Runs in a child Python with the tree under test first on sys.path; prints seconds to spawn.
PROBE = """
import os, sys, time
began = time.perf_counter()
try:
    from sm120.engine.runtime import native
except ImportError:  # revisions before the layered packages
    from sm120.runtime import native

def spawn_now(self, spec, log_path):
    print(f"{time.perf_counter() - began:.4f}", flush=True)
    os._exit(0)

native.NativeRuntime.start = spawn_now
from sm120.cli.app import app
sys.argv = ["sm120", "launch", "tiny", "--port", "41234", "--model-dir", sys.argv[1],
            "--api-key", "prespawn"]
app()
"""


def seconds_to_spawn(tree: Path, model: Path, home: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "SM120_HOME": str(home), "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(model)],
        env=env, capture_output=True, text=True, check=False, cwd=tree,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise SystemExit(f"no spawn from {tree}: {done.stderr[-1500:]}")
    return float(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", default="HEAD~1", help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    python = os.environ.get("VLLM_PYTHON") or sys.exit("set VLLM_PYTHON to the engine's python")
    work = Path(tempfile.mkdtemp(prefix="sm120-prespawn-"))
    model = ensure_tiny_model(Path(python), work / "tiny", lambda _: None)
    other = work / "other"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(other), args.against],
        check=True,
    )
    try:
        ours, theirs = [], []
        for _ in range(args.rounds):
            theirs.append(seconds_to_spawn(other, model, work / "home-other"))
            ours.append(seconds_to_spawn(REPO, model, work / "home-ours"))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)])
    mine, base = statistics.median(ours), statistics.median(theirs)
    print(f"to engine spawn, median of {args.rounds}: this tree {mine:.3f} s, "
          f"{args.against} {base:.3f} s, ratio {mine / base:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
