"""Failure naming over real public logs (tests/data/failure_logs/cases.yaml): each labelled log
is named by exactly its ids, no healthy log names anything, and the whole set scores at or
above the issue's goal."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.failure_naming import CASES, DATA, evaluate
from sm120.logs.diagnosis.naming import name_failures
from sm120.logs.diagnosis.scoring import LabelledLog, load_cases
from sm120.logs.failures import load_catalogue

LABELLED = load_cases(CASES)
FAILING = [case for case in LABELLED if not case.healthy]


def _lines(case: LabelledLog) -> list[str]:
    return (DATA / case.file).read_text(encoding="utf-8").splitlines()


def test_the_set_meets_the_goal_and_raises_no_false_alarm() -> None:
    result = evaluate()
    assert len(result.failures) == len(FAILING) >= 15
    assert len(result.healthy) >= 30  # the vLLM corpus, 0.3 to 0.32, plus the PCIe excerpt
    assert result.named_right / len(result.failures) >= 0.9
    assert result.false_alarms == []


@pytest.mark.parametrize("case", FAILING, ids=lambda case: Path(case.file).name)
def test_each_real_failure_log_is_named_by_its_ids(case: LabelledLog) -> None:
    named = [found.id for found in name_failures(_lines(case), went_silent=case.silent)]
    assert sorted(named) == sorted(case.expect)


@pytest.mark.parametrize("case", FAILING, ids=lambda case: Path(case.file).name)
def test_every_labelled_log_names_its_source_and_known_ids(case: LabelledLog) -> None:
    assert case.source.startswith(("https://", "seed "))
    assert set(case.expect) <= set(load_catalogue())
    assert (DATA / case.file).is_file()


def test_a_hang_is_named_only_when_the_engine_went_silent() -> None:
    [case] = [case for case in LABELLED if case.file.endswith("nccl_init_complete_silence.log")]
    lines = _lines(case)
    assert [found.id for found in name_failures(lines, went_silent=True)] == ["F10"]
    assert name_failures(lines, went_silent=False) == []
    # The same lines followed by the rest of a start are a healthy start.
    going_on = [*lines, "(APIServer pid=1) INFO:     Application startup complete."]
    assert name_failures(going_on, went_silent=True) == []


def test_the_named_hang_quotes_the_line_it_stopped_after() -> None:
    lines = ["INFO 07-08 11:50:03 pynccl.py:63] vLLM is using nccl==2.20.5", "", "  "]
    [found] = name_failures(lines, went_silent=True)
    assert found.id == "F10"
    assert found.line == lines[0]
    assert "NCCL_P2P_DISABLE=1" in found.fix


def test_a_dead_engine_is_not_also_called_hung() -> None:
    lines = [
        "[19:01:01 TP0] Init nccl begin.",
        "RuntimeError: CUDART error: peer access is not supported between these two devices",
        "[19:01:01 TP0] Init nccl begin.",
    ]
    assert [found.id for found in name_failures(lines, went_silent=True)] == ["F10b"]


def test_a_broadcast_stall_while_compiling_is_not_a_wedge_but_after_ready_it_is() -> None:
    stall = (
        "(EngineCore pid=7) INFO 11-21 00:09:33 [shm_broadcast.py:871] No available shared "
        "memory broadcast block found in 60 seconds."
    )
    compiling = "(Worker pid=9) INFO 11-21 00:08:32 [cpu_model_runner.py:87] Warming up model "
    compiling += "for the compilation..."
    ready = "(APIServer pid=1) INFO:     Application startup complete."
    assert name_failures([compiling, stall]) == []
    assert [found.id for found in name_failures([compiling, stall, ready, stall])] == ["F22"]
