"""The P2P probe's CUDA path: copies between every GPU pair and an NCCL all-reduce. These need
two NVIDIA GPUs and a CUDA engine (VLLM_PYTHON); CI and GPU-less machines skip them, saying
why (tests/conftest.py). The forced failures use the test-only SM120_TEST_P2P_FAULT, the way
a machine with working P2P (NVLink) can still show the failure path."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from sm120.doctor.p2p import ProbeLimits
from sm120.doctor.p2p_live import doctor_p2p
from sm120.doctor.run import Machine
from tests.helpers import probes_running

# On one GPU the probe runs its CPU (gloo) path, which the unit tests already cover.
pytestmark = [pytest.mark.gpu, pytest.mark.gpus(2)]


def live(**environ: str) -> Machine:
    return replace(Machine(), environ={**os.environ, **environ})


def python() -> str:
    return str(Path(os.environ["VLLM_PYTHON"]))


def test_every_pair_copies_verified_and_nccl_all_reduces() -> None:
    report = doctor_p2p(python(), machine=live())
    assert report.ok, report.document()
    assert report.backend == "nccl" and report.world >= 2
    copies = [step for step in report.steps if step.step.startswith("copy")]
    assert len(copies) == report.world * (report.world - 1)
    assert all(step.gbps is not None and step.gbps > 0 for step in copies)
    assert all(step.peer_access is not None for step in copies)
    assert report.steps[-1].step == "all-reduce"
    assert probes_running() == []


def test_a_corrupted_copy_is_f10() -> None:
    report = doctor_p2p(python(), machine=live(SM120_TEST_P2P_FAULT="wrong"))
    failed = report.first_failure
    assert failed is not None and failed.step == "copy GPU0->GPU1"
    assert failed.detail == "wrong result: the copy differs from what was sent"
    assert report.failure_id == "F10"


def test_a_hung_nccl_all_reduce_is_killed_as_f10() -> None:
    report = doctor_p2p(
        python(),
        machine=live(SM120_TEST_P2P_FAULT="hang"),
        limits=ProbeLimits(all_reduce_s=60.0),
    )
    failed = report.first_failure
    assert failed is not None and failed.step == "all-reduce" and failed.timed_out
    assert report.failure_id == "F10"
    assert probes_running() == []
