"""`sm120 tune` on a GPU: the tiny recipe's gpu variant serving Llama-3-8B's shape with vLLM's
dummy weights (benchmarks/gpu_proof.py's BENCH_SHAPES), searched over the variant's tune:
block (three knobs), then the launch that applies the result, shown with --dry-run.

On the device (CUDA vLLM in /tmp/py, docs/gpu-proof.md):
    python benchmarks/tune_gpu.py --vllm-python /tmp/py --budget 6.5 --out DIR

Writes DIR/tune-result.json (the result with every candidate and pair), DIR/tune.stderr
(progress), DIR/tune-chart.svg, DIR/launch-dry-run.txt (the tuned launch and --no-tuned) and
DIR/after.txt (nvidia-smi's compute processes once it ended: nothing left running).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_proof import BENCH_SHAPES  # noqa: E402

# Every candidate shares these: dummy weights, and a startup check that three engines pass at
# once (vLLM refuses to start while free memory is below gpu-memory-utilization x total; the
# KV pool itself is the variant's fixed kv-cache-memory-bytes).
BASE_SETS = ("load-format=dummy", "gpu-memory-utilization=0.25")


def sm120(home: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM120_")}
    env.update(SM120_HOME=str(home), NO_COLOR="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "sm120", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def shape_dir(vllm_python: str, work: Path, shape: str) -> Path:
    from sm120.engine.tiny_model import ensure_tiny_model

    tiny = ensure_tiny_model(Path(vllm_python), work / "tiny", lambda _: None)
    dest = work / f"shape-{shape}"
    dest.mkdir(exist_ok=True)
    for item in tiny.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copyfile(item, dest / item.name)
    config = {**json.loads((tiny / "config.json").read_text()), **(BENCH_SHAPES[shape] or {})}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def seed_progress(home: Path, model: Path, result: Path, rounds: int) -> str:
    """Write the progress file `sm120 tune` would have kept, from a result's candidates."""
    os.environ["SM120_HOME"] = str(home)
    from sm120.plan.request import plan_request
    from sm120.tune.runner import Progress, TuneRequest, save_progress, start_search
    from sm120.tune.search import Outcome

    class Quiet:
        def line(self, text: str) -> None: ...

        def step(self, done: int, total: int, eta_s: float | None, text: str) -> None: ...

    plan = plan_request(
        "tiny", environ={}, variants=["gpu"], sets=list(BASE_SETS), model_dir=str(model)
    )
    search = start_search(TuneRequest(plan=plan, rounds=rounds), Quiet())
    document = json.loads(result.read_text())
    if document["fingerprint"] != search.fingerprint:
        return f"not seeded: the fingerprint differs ({document['fingerprint']})"
    outcomes = [Outcome.from_dict(item) for item in document["candidates"]]
    progress = Progress(
        search.progress.identity,
        {outcome.candidate.key: outcome for outcome in outcomes},
        [],  # pairs are measured again, on this machine, for whichever leader stands
        float(document["spent_s"]),
        float(document["started_at"]),
    )
    save_progress(search.path, progress)
    return f"seeded {len(outcomes)} measured candidates from {result}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=6.5, help="minutes")
    parser.add_argument("--shape", default="8b", choices=sorted(BENCH_SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--resume-result",
        type=Path,
        help="a result this benchmark wrote before (on a machine that has since gone cold): "
        "its measured candidates seed the search, as a run's own progress file would, when "
        "the host's fingerprint and the search are the same",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tune-gpu-"))
    home = work / "home"
    model = shape_dir(args.vllm_python, work, args.shape)
    common = ["-V", "gpu", "--model-dir", str(model), "--vllm-python", args.vllm_python]
    for setting in BASE_SETS:
        common += ["--set", setting]
    if args.resume_result is not None:
        print(seed_progress(home, model, args.resume_result, args.rounds), flush=True)
    tuned = sm120(
        home,
        "tune", "tiny", *common,
        "--budget", f"{args.budget:g}", "--rounds", str(args.rounds), "--json",
        timeout=args.budget * 60 + 240,
    )  # fmt: skip
    (args.out / "tune.stderr").write_text(tuned.stderr)
    (args.out / "tune-result.json").write_text(tuned.stdout)
    print(tuned.stderr[-4000:])
    if tuned.returncode == 0:
        document = json.loads(tuned.stdout)
        shutil.copyfile(document["chart"], args.out / "tune-chart.svg")
        lines = []
        for extra in ((), ("--no-tuned",)):
            shown = sm120(home, "launch", "tiny", *common, "--dry-run", *extra, timeout=120)
            lines += [f"$ sm120 launch tiny ... --dry-run {' '.join(extra)}", shown.stderr]
            lines += [shown.stdout]
        (args.out / "launch-dry-run.txt").write_text("\n".join(lines))
    after = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
        capture_output=True,
        text=True,
        check=False,
    )
    (args.out / "after.txt").write_text(after.stdout + after.stderr)
    return tuned.returncode


if __name__ == "__main__":
    sys.exit(main())
