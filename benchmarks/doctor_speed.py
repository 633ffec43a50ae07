"""What doctor costs: the launch preflight for the tiny recipe against bare start-up of the
engine's Python (the floor for asking it anything), a whole `sm120 doctor` run against
`sm120 --help`, and parsing the captured nvidia-smi corpus. Alternating runs, medians.

Run: VLLM_PYTHON=... python benchmarks/doctor_speed.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "data" / "nvidia_smi"


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    engine = os.environ.get("VLLM_PYTHON") or sys.exit("set VLLM_PYTHON to the engine's python")
    sm120 = shutil.which("sm120") or sys.exit("sm120 is not on PATH: pip install -e . first")
    os.environ.setdefault("SM120_HOME", tempfile.mkdtemp(prefix="sm120-bench-"))

    from sm120.doctor import preflight
    from sm120.doctor.capture import parse_text
    from sm120.plan.resolve import PlanRequest, resolve

    plan = resolve(PlanRequest(recipe="tiny", port=18999))
    texts = [p.read_text() for p in sorted(CORPUS.glob("*.txt"))]
    pre, bare, doctor, helps, parse = [], [], [], [], []
    for _ in range(runs):
        pre.append(timed(lambda: preflight(plan, engine_python=engine)))
        bare.append(wall([engine, "-c", "pass"]))
        doctor.append(wall([sm120, "doctor", "tiny", "--vllm-python", engine, "--json"]))
        helps.append(wall([sm120, "--help"]))
        parse.append(timed(lambda: [parse_text(t) for t in texts]))
    m = statistics.median
    print(f"preflight (tiny)          median {m(pre) * 1000:7.1f} ms")
    print(f"engine python -c pass     median {m(bare) * 1000:7.1f} ms")
    print(f"  ratio                          {m(pre) / m(bare):7.2f}x")
    print(f"sm120 doctor tiny --json  median {m(doctor) * 1000:7.1f} ms")
    print(f"sm120 --help              median {m(helps) * 1000:7.1f} ms")
    print(f"  ratio                          {m(doctor) / m(helps):7.2f}x")
    per_file = m(parse) / len(texts) * 1000
    print(f"parse {len(texts)} captured files  median {m(parse) * 1000:7.1f} ms "
          f"({per_file:.2f} ms per file)")  # fmt: skip
    print(f"over {runs} alternating runs")


if __name__ == "__main__":
    main()
