"""The search without engines (a fake door in their place): its order, the pairs, Ctrl-C and
the resume from what was kept, the budget, and candidates the rules refuse for free."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import sm120.tune.runner as runner
from sm120.plan.request import plan_request
from sm120.tune.runner import Running, Search, TuneInterrupted, TuneRequest, run_tune, start_search
from sm120.tune.space import Candidate
from tests.helpers import REPO

# aggregate tok/s each candidate "measures": max-num-seqs=8 is clearly better.
FIGURES = {"default": 100.0, "max-num-seqs=8": 150.0}


class FakeEngines:
    def __init__(self) -> None:
        self.running: dict[str, Running] = {}
        self.started: list[str] = []

    def start(self, candidate: Candidate) -> Running:
        self.started.append(candidate.label)
        running = Running(candidate.label, "http://127.0.0.1:1", None, "tiny")
        self.running[candidate.key] = running
        return running

    def stop(self, candidate: Candidate) -> None:
        self.running.pop(candidate.key, None)

    def stop_all(self) -> None:
        self.running.clear()


class View:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)

    def step(self, done: int, total: int, eta_s: float | None, text: str) -> None:
        self.lines.append(f"[{done + 1}/{total}] {text}")


started_everywhere: list[FakeEngines] = []


def starter(request: TuneRequest, view: Any) -> Search:
    search = start_search(request, view)
    engines = FakeEngines()
    started_everywhere.append(engines)
    search.engines = engines  # type: ignore[assignment]
    return search


def measure_by_label(monkeypatch: pytest.MonkeyPatch, calls: list[str], stop_at: int = 0) -> None:
    def measure(objective: Any, workload: Any, maker: Any, url: str, key: Any, model: str,
                salt: str) -> float:  # fmt: skip
        calls.append(salt)
        if stop_at and len(calls) == stop_at:
            raise KeyboardInterrupt
        return FIGURES[current[0]]

    current: list[str] = ["default"]

    def sample(self: Search, running: Running, salt: str) -> float:
        current[0] = running.name  # FakeEngines names a deployment by its label
        return measure(None, None, None, running.base_url, None, running.model, salt)

    monkeypatch.setattr(Search, "sample", sample)


def request(**extra: Any) -> TuneRequest:
    plan = plan_request("tiny", environ={})
    return TuneRequest(plan=plan, rounds=2, **extra)


def test_the_search_measures_both_then_pairs_and_keeps_a_gain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    measure_by_label(monkeypatch, calls)
    view = View()
    document = run_tune(request(), view, starter)
    labels = [c["label"] for c in document["candidates"]]
    assert labels == ["default", "max-num-seqs=8"]
    assert [c["samples"] for c in document["candidates"]] == [[100.0, 100.0], [150.0, 150.0]]
    # tiny's block: pairs 2, side by side, so both were kept up and nothing relaunched.
    assert started_everywhere[-1].started == ["default", "max-num-seqs=8"]
    leader = document["leader"]["key"]
    assert document["pairs"] == [
        {"default": 100.0, "leader": 150.0, "leader_first": True, "leader_key": leader},
        {"default": 100.0, "leader": 150.0, "leader_first": False, "leader_key": leader},
    ]
    assert document["verdict"]["gain"] is True
    assert document["verdict"]["change_pct"] == 50.0
    assert document["winner"]["sets"] == ["max-num-seqs=8"]
    assert started_everywhere[-1].running == {}  # nothing left running


def test_ctrl_c_keeps_what_was_measured_and_the_rerun_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    # default: warm + 2 rounds = 3 calls; the 5th is the candidate's first round.
    measure_by_label(monkeypatch, calls, stop_at=5)
    with pytest.raises(TuneInterrupted) as caught:
        run_tune(request(), View(), starter)
    assert caught.value.one_line() == (
        "interrupted: 1 candidates and 0 pairs are kept, and nothing is left running "
        "(hint: run the same command again to go on from there)"
    )
    assert started_everywhere[-1].running == {}
    calls.clear()
    measure_by_label(monkeypatch, calls)
    view = View()
    document = run_tune(request(), view, starter)
    assert "resuming: 1 candidates and 0 pairs kept" in view.lines
    # Only the candidate not measured yet is measured; the default starts again beside it,
    # at once, for the pairs (the first run stopped everything).
    assert sorted(started_everywhere[-1].started) == ["default", "max-num-seqs=8"]
    assert len(document["candidates"]) == 2
    assert document["verdict"]["gain"] is True


def test_fresh_starts_over(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    measure_by_label(monkeypatch, calls)
    run_tune(request(), View(), starter)
    view = View()
    run_tune(request(fresh=True), view, starter)
    assert not any(line.startswith("resuming") for line in view.lines)
    assert sorted(started_everywhere[-1].started) == ["default", "max-num-seqs=8"]


def test_a_changed_objective_does_not_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    measure_by_label(monkeypatch, calls)
    run_tune(request(), View(), starter)
    view = View()
    run_tune(request(concurrency=2), view, starter)
    assert (
        "the space, objective, workload or host changed since the last run; starting over"
        in view.lines
    )


def test_a_candidate_the_rules_refuse_costs_no_launch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes)
    text = (recipes / "tiny.yaml").read_text()
    # S01 refuses a DCP that does not divide the TP size: planned, never launched.
    text = text.replace("    max-num-seqs: [4, 8]\n", "    decode-context-parallel-size: [3]\n")
    (recipes / "tiny.yaml").write_text(text)
    monkeypatch.setenv("SM120_RECIPES_DIR", str(recipes))
    calls: list[str] = []
    measure_by_label(monkeypatch, calls)
    view = View()
    document = run_tune(request(), view, starter)
    (skipped,) = [c for c in document["candidates"] if c["status"] == "skipped"]
    assert skipped["label"] == "decode-context-parallel-size=3"
    assert skipped["status"] == "skipped"
    assert skipped["reason"].startswith("[S01] ")
    assert started_everywhere[-1].started == ["default"]
    assert any(
        line.startswith("skipped decode-context-parallel-size=3: [S01]") for line in view.lines
    )
    assert document["verdict"] == {"gain": False, "pairs": 0, "why": "the default measured best"}


def one_at_a_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes)
    text = (recipes / "tiny.yaml").read_text().replace("  side_by_side: true\n", "", 1)
    (recipes / "tiny.yaml").write_text(text)
    monkeypatch.setenv("SM120_RECIPES_DIR", str(recipes))


def test_one_at_a_time_each_candidate_is_launched_and_stopped_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    one_at_a_time(monkeypatch, tmp_path)
    calls: list[str] = []
    measure_by_label(monkeypatch, calls)
    document = run_tune(request(), View(), starter)
    # default, candidate, then the two pairs relaunch each side (warm-up included).
    assert started_everywhere[-1].started == [
        "default",
        "max-num-seqs=8",
        "max-num-seqs=8",
        "default",
        "default",
        "max-num-seqs=8",
    ]
    assert document["verdict"]["gain"] is True


def test_the_budget_stops_the_search(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    one_at_a_time(monkeypatch, tmp_path)
    calls: list[str] = []
    measure_by_label(monkeypatch, calls)
    clock = iter(range(0, 100000, 100))
    monkeypatch.setattr(runner.time, "monotonic", lambda: float(next(clock)))
    view = View()
    document = run_tune(request(budget_s=60.0), view, starter)
    assert [c["label"] for c in document["candidates"]] == ["default"]
    assert any(line.startswith("budget: 1 min would be exceeded") for line in view.lines)
    assert document["verdict"]["gain"] is False
