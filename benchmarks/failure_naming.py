"""How well failures are named in real public logs, and false alarms on healthy ones.

Runs the naming of sm120/logs/diagnosis/naming.py over every labelled log of
tests/data/failure_logs/cases.yaml (real excerpts from vLLM, SGLang, NCCL, Ray, Dynamo and
TensorRT-LLM threads) and over every healthy capture of tests/data/vllm_logs/ (including the
tiny engine's own start on this machine), then prints each miss and the score.

Run: python benchmarks/failure_naming.py [--verbose]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sm120.logs.diagnosis.scoring import Score, healthy_captures, load_cases, score

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
CASES = DATA / "failure_logs" / "cases.yaml"


def evaluate() -> Score:
    labelled = load_cases(CASES)
    return score([*labelled, *healthy_captures(DATA / "vllm_logs", labelled, DATA)], DATA)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="List every log and its names.")
    args = parser.parse_args()
    result = evaluate()
    for outcome in [*result.failures, *result.healthy]:
        wrong = not outcome.right if not outcome.case.healthy else bool(outcome.named)
        if wrong or args.verbose:
            mark = "MISS" if wrong else "ok  "
            print(
                f"{mark} {outcome.case.file}: expected {list(outcome.case.expect)}, "
                f"named {list(outcome.named)}"
            )
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
