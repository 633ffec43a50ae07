"""sm120's own time before it spawns the engine: `sm120 launch tiny` from process start to the
moment it would start the engine (the runtime's start is replaced by a stop-watch), for this
tree against another revision, alternating, on this machine. This is the part of time to READY
that sm120 adds to a bare `vllm serve` (benchmarks/gpu_proof.py measures the whole on a GPU).

Run: VLLM_PYTHON=... python benchmarks/launch_prespawn.py [--against REV] [--rounds 6]
     VLLM_PYTHON=... python benchmarks/launch_prespawn.py --profile 40 [-V gpu]
The second form profiles this tree alone (no git needed, e.g. on the GPU machine): each round's
seconds to spawn, then where the last round spent them, sm120's functions and every child
process it ran.
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
profile = None
if os.environ.get("SM120_PRESPAWN_PROFILE"):
    import cProfile
    profile = cProfile.Profile()
    profile.enable()
try:
    from sm120.engine.runtime import native
except ImportError:  # revisions before the layered packages
    from sm120.runtime import native

def spawn_now(self, spec, log_path):
    took = time.perf_counter() - began
    if profile is not None:
        import pstats
        profile.disable()
        stats = pstats.Stats(profile, stream=sys.stdout).sort_stats("cumulative")
        stats.print_stats("sm120/", int(os.environ["SM120_PRESPAWN_PROFILE"]))
        stats.print_stats("subprocess.py.*(run|communicate|_wait)", 6)
    print(f"{took:.4f}", flush=True)
    os._exit(0)

native.NativeRuntime.start = spawn_now
from sm120.cli.app import app
sys.argv = ["sm120", "launch", "tiny", "--port", "41234", "--model-dir", sys.argv[1],
            "--api-key", "prespawn", *sys.argv[2:]]
app()
"""


def seconds_to_spawn(
    tree: Path, model: Path, home: Path, variants: list[str], profile_rows: int = 0
) -> float:
    # The tree under test first, then what the caller's PYTHONPATH holds (the GPU machine's
    # Python finds its packages through it).
    path = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "SM120_HOME": str(home), "NO_COLOR": "1"}
    if profile_rows:
        env["SM120_PRESPAWN_PROFILE"] = str(profile_rows)
    extra = [item for variant in variants for item in ("-V", variant)]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(model), *extra],
        env=env, capture_output=True, text=True, check=False, cwd=tree,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise SystemExit(f"no spawn from {tree}: {done.stderr[-1500:]}")
    if profile_rows:
        print("\n".join(line.rstrip()[:170] for line in lines[:-1] if line.strip()))
    return float(lines[-1])


def profile_this_tree(model: Path, work: Path, args: argparse.Namespace) -> None:
    took = [
        seconds_to_spawn(REPO, model, work / "home-profile", args.variant)
        for _ in range(args.rounds)
    ]
    print("to engine spawn, this tree: " + ", ".join(f"{t:.3f}" for t in took) + " s")
    seconds_to_spawn(REPO, model, work / "home-profile", args.variant, args.profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", default="HEAD~1", help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("-V", "--variant", action="append", default=[], help="recipe variant")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="ROWS", help="profile this tree alone"
    )
    args = parser.parse_args()
    python = os.environ.get("VLLM_PYTHON") or sys.exit("set VLLM_PYTHON to the engine's python")
    work = Path(tempfile.mkdtemp(prefix="sm120-prespawn-"))
    model = ensure_tiny_model(Path(python), work / "tiny", lambda _: None)
    if args.profile:
        profile_this_tree(model, work, args)
        return
    other = work / "other"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(other), args.against],
        check=True,
    )
    try:
        ours, theirs = [], []
        for _ in range(args.rounds):
            theirs.append(seconds_to_spawn(other, model, work / "home-other", args.variant))
            ours.append(seconds_to_spawn(REPO, model, work / "home-ours", args.variant))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)])
    mine, base = statistics.median(ours), statistics.median(theirs)
    print(f"to engine spawn, median of {args.rounds}: this tree {mine:.3f} s, "
          f"{args.against} {base:.3f} s, ratio {mine / base:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
