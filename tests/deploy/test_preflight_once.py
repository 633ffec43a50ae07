"""A launch runs the preflight before fetching weights and, once the engine's Python is known,
again; a pass that still stands (same plan and Python, moments ago) is not repeated."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sm120.deploy import launcher
from sm120.deploy.launcher import PREFLIGHT_STANDS_S, LaunchOptions, PreflightPassed
from sm120.doctor.findings import Finding
from sm120.plan.resolve import LaunchPlan, PlanRequest, resolve


@pytest.fixture
def plan(isolated_home: Path) -> LaunchPlan:
    return resolve(PlanRequest(recipe="tiny"))


@pytest.fixture
def preflights(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every preflight the launcher runs, recorded; each finds a warning and nothing blocking."""
    runs: list[dict[str, Any]] = []

    def preflight(plan: LaunchPlan, **kwargs: Any) -> list[Finding]:
        runs.append(kwargs)
        return [Finding("shm", "warn", "/dev/shm is small")]

    monkeypatch.setattr(launcher, "preflight", preflight)
    monkeypatch.setenv("VLLM_PYTHON", "/opt/engine/bin/python")
    return runs


def test_a_pass_names_the_engine_python_the_checks_ran_against(
    plan: LaunchPlan, preflights: list[dict[str, Any]]
) -> None:
    printed: list[str] = []
    passed = launcher.preflight_or_stop(plan, None, printed.append)
    assert passed is not None
    assert (passed.plan_hash, passed.engine_python) == (plan.plan_hash, "/opt/engine/bin/python")
    assert passed.stands_for(plan, "/opt/engine/bin/python")
    assert printed == ["warning [shm]: /dev/shm is small"]


def test_while_replacing_a_pass_is_not_kept(
    plan: LaunchPlan, preflights: list[dict[str, Any]]
) -> None:
    assert launcher.preflight_or_stop(plan, None, lambda _: None, replacing=True) is None


def test_a_pass_stands_only_for_its_plan_its_python_and_a_short_while(plan: LaunchPlan) -> None:
    now = time.monotonic()
    passed = PreflightPassed(plan.plan_hash, "/py", now)
    assert passed.stands_for(plan, "/py")
    assert not passed.stands_for(plan, "/other/python")
    assert not PreflightPassed("another-plan", "/py", now).stands_for(plan, "/py")
    stale = PreflightPassed(plan.plan_hash, "/py", now - PREFLIGHT_STANDS_S - 1)
    assert not stale.stands_for(plan, "/py")


@pytest.mark.parametrize(
    ("passed_python", "age_s", "runs"),
    [("/py", 0.0, 0), ("/py", PREFLIGHT_STANDS_S + 1, 1), ("/elsewhere", 0.0, 1), (None, 0, 1)],
)
def test_the_launcher_repeats_the_preflight_only_when_the_pass_does_not_stand(
    plan: LaunchPlan,
    preflights: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    passed_python: str | None,
    age_s: float,
    runs: int,
) -> None:
    monkeypatch.setattr(launcher, "engine_python", lambda *_: "/py")
    monkeypatch.setattr(launcher, "p2p_gate", lambda *_: {})
    monkeypatch.setattr(launcher, "model_ready", lambda *_: None)
    monkeypatch.setattr(launcher, "start_spec", lambda *_: "spec")
    stamp = None
    if passed_python is not None:
        stamp = PreflightPassed(plan.plan_hash, passed_python, time.monotonic() - age_s)
    native = type("Native", (), {"kind": "native"})()
    spec = launcher._prepare(plan, native, LaunchOptions("tiny", preflight=stamp), print)
    assert spec == "spec"
    assert len(preflights) == runs
