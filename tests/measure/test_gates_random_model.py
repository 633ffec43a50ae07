"""The tiny recipe's random model: its gates say what it can and cannot show, and check what
it can (an answer through each API path), instead of reading '0/9 cases passed - FAILED'."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from sm120.deploy.checked import plan_document
from sm120.deploy.gate import run_gate_suites
from sm120.measure.cases import builtin_gates, select
from sm120.measure.gate_report import summary_line
from sm120.measure.gates import GateOptions
from sm120.measure.target import Target, _generated, target_for_url
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.helpers import plan_for

NOISE = "rounded Ancestral zq qq ploughed ringing"


@pytest.fixture
def random_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAIServer]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-scripted-secret")
    with FakeOpenAIServer(api_key="sk-scripted-secret", model="scripted") as server:
        server.when(r"[\s\S]", Reply(content=NOISE))
        yield server


def run(target: Target, suite: str) -> dict[str, object]:
    chosen = [(suite, select(builtin_gates(), suite))]
    (report,) = run_gate_suites(target, chosen, GateOptions(max_tokens=16), echo=None)
    return report


def test_noise_fails_the_gates_of_a_real_model(random_server: FakeOpenAIServer) -> None:
    report = run(target_for_url(random_server.url, None), "core")
    assert report["passed"] == 0 and report["random_model"] is None


@pytest.mark.parametrize("suite", ["core", "tools"])
def test_a_random_model_is_checked_for_what_it_can_show(
    random_server: FakeOpenAIServer, suite: str
) -> None:
    target = dataclasses.replace(target_for_url(random_server.url, None), random_model=True)
    report = run(target, suite)
    assert report["failed"] == 0 and report["passed"] == len(select(builtin_gates(), suite))
    line = summary_line(report)
    assert line.startswith(f"{suite}: {report['passed']}/{report['passed']} cases passed - passed")
    assert "random model: its weights are random" in line
    assert "no case can show correctness" in line


def test_an_empty_answer_still_fails_a_random_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-scripted-secret")
    with FakeOpenAIServer(api_key="sk-scripted-secret", model="scripted") as server:
        server.when("17 multiplied", Reply(content=""))
        server.when(r"[\s\S]", Reply(content=NOISE))
        target = dataclasses.replace(target_for_url(server.url, None), random_model=True)
        report = run(target, "core")
    assert report["failed"] == 1


def test_the_saved_plan_says_when_the_model_is_random() -> None:
    assert _generated(plan_document(plan_for("tiny")))
    assert not _generated(plan_document(plan_for("glm52")))


def test_garbled_noise_is_not_held_against_a_random_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # Random weights over a byte-level vocabulary answer with broken characters and loops.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-scripted-secret")
    garbled = "\ufffd\ufffd ab " + "zz " * 40
    with FakeOpenAIServer(api_key="sk-scripted-secret", model="scripted") as server:
        server.when(r"[\s\S]", Reply(content=garbled))
        real = run(target_for_url(server.url, None), "core")
        random = run(
            dataclasses.replace(target_for_url(server.url, None), random_model=True), "core"
        )
    assert real["passed"] == 0
    assert random["failed"] == 0
