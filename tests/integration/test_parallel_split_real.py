"""Rule S10 (heads over tensor and decode context parallel) against vLLM's own check: the real
vLLM (CPU build) judges each TP / DCP pair for the tiny model (4 attention heads, 2 KV heads)
with ModelConfig.verify_with_parallel_config, and the rule must refuse exactly the pairs vLLM
refuses. Nine GPUs' TP 9 and odd sizes are in the grid; no engine is started."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sm120.plan.hardware import Hardware
from tests.plan.test_rules import results

pytestmark = pytest.mark.integration

PAIRS = [
    (1, 1),
    (2, 1),
    (3, 1),
    (4, 1),
    (6, 1),
    (8, 1),
    (9, 1),
    (2, 2),
    (4, 2),
    (4, 4),
    (8, 2),
    (8, 4),
    (6, 2),
    (6, 3),
]

JUDGE = """
import json, sys
from vllm.config import ModelConfig, ParallelConfig
model = ModelConfig(model=sys.argv[1])
verdicts = {}
for tp, dcp in json.loads(sys.argv[2]):
    try:
        model.verify_with_parallel_config(
            ParallelConfig(tensor_parallel_size=tp, decode_context_parallel_size=dcp))
        verdicts[f"{tp}/{dcp}"] = "ok"
    except ValueError as error:
        verdicts[f"{tp}/{dcp}"] = str(error).splitlines()[0]
print("VERDICTS " + json.dumps(verdicts))
"""


def test_s10_refuses_what_vllm_refuses(engine_python: Path, tiny_model: Path) -> None:
    done = subprocess.run(
        [str(engine_python), "-c", JUDGE, str(tiny_model), json.dumps(PAIRS)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    line = next(row for row in done.stdout.splitlines() if row.startswith("VERDICTS "))
    verdicts = json.loads(line.removeprefix("VERDICTS "))
    assert verdicts["3/1"].startswith("Total number of attention heads (4) must be divisible")
    nine = Hardware(gpus=9, arch="cpu", source="declared")
    for tp, dcp in PAIRS:
        sets = (f"tensor-parallel-size={tp}", f"decode-context-parallel-size={dcp}")
        rule = results("tiny", sets=sets, hardware=nine)["S10"]
        refused = rule.status == "fail"  # type: ignore[attr-defined]
        assert refused == (verdicts[f"{tp}/{dcp}"] != "ok"), (tp, dcp, verdicts[f"{tp}/{dcp}"])
