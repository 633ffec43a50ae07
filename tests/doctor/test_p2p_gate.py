"""The launch's P2P decision (sm120/doctor/p2p_gate.py) and its place in the launcher: PCIe
only with several GPUs probes, a cached verdict for this boot and topology does not, and a
failed probe starts the engine with NCCL_P2P_DISABLE=1. The probe here is a stand-in that
returns a report; the real probe runs in tests/integration/test_p2p_probe.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.deploy import launcher
from sm120.deploy.launcher import LaunchOptions, p2p_gate, start_spec
from sm120.doctor.p2p import P2PReport, StepResult, p2p_findings, probe_env, run_p2p_probe
from sm120.doctor.p2p_gate import P2PDecision, cache_key, decide_p2p
from sm120.doctor.p2p_live import plan_gpus
from sm120.doctor.snapshot import Topology
from sm120.plan.resolve import PlanRequest, resolve
from tests.helpers import invoke, one_line_error

PCIE = Topology(devices=["GPU0", "GPU1"], links={"GPU0-GPU1": "PHB"})
NVLINK = Topology(devices=["GPU0", "GPU1"], links={"GPU0-GPU1": "NV18"})


class Probe:
    """Counts calls and answers with a fixed report."""

    def __init__(self, report: P2PReport) -> None:
        self.report = report
        self.calls = 0

    def __call__(self) -> P2PReport:
        self.calls += 1
        return self.report


def passed() -> P2PReport:
    return P2PReport(world=2, backend="nccl", steps=[StepResult("all-reduce", True, 1.0)])


def hung() -> P2PReport:
    step = StepResult("copy GPU0->GPU1", False, 30.0, True, "no answer within 30 s (hung)")
    return P2PReport(world=2, backend="nccl", steps=[StepResult("torch", True, 2.0), step])


def decide(probe: Probe, cache: Path, **changes: object) -> P2PDecision:
    arguments: dict[str, object] = {
        "gpus": (0, 1),
        "topology": PCIE,
        "plan_env": {},
        "boot_id": "boot-1",
        "probe": probe,
        "cache_file": cache,
    }
    arguments.update(changes)
    return decide_p2p(**arguments)  # type: ignore[arg-type]  # a mix of types by design


def test_pcie_only_probes_once_per_boot_and_topology(tmp_path: Path) -> None:
    probe, cache = Probe(passed()), tmp_path / "p2p.json"
    first = decide(probe, cache)
    assert probe.calls == 1 and first.probed and first.env == {}
    assert first.messages == ("P2P probe: GPU peer-to-peer works",)
    again = decide(probe, cache)
    assert probe.calls == 1 and not again.probed
    assert again.messages == (
        "P2P probe (cached for this boot and topology): GPU peer-to-peer works",
    )
    decide(probe, cache, boot_id="boot-2")  # rebooted
    decide(probe, cache, topology=Topology(devices=PCIE.devices, links={"GPU0-GPU1": "SYS"}))
    decide(probe, cache, gpus=(1, 2))
    assert probe.calls == 4


def test_a_failed_probe_disables_p2p_and_says_so_also_from_the_cache(tmp_path: Path) -> None:
    probe, cache = Probe(hung()), tmp_path / "p2p.json"
    decision = decide(probe, cache)
    assert decision.env == {"NCCL_P2P_DISABLE": "1"}
    assert decision.messages == (
        "P2P probe failed [F10] (copy GPU0->GPU1: no answer within 30 s (hung)); starting "
        "with NCCL_P2P_DISABLE=1 (NCCL goes through host memory)",
    )
    cached = decide(probe, cache)
    assert probe.calls == 1
    assert cached.env == {"NCCL_P2P_DISABLE": "1"}
    stored = json.loads(cache.read_text())
    assert list(stored) == [cache_key("boot-1", PCIE, (0, 1))]
    assert next(iter(stored.values()))["failure"] == "F10"


@pytest.mark.parametrize(
    "changes",
    [
        {"topology": NVLINK},
        {"topology": None},
        {"gpus": (0,)},
        {"plan_env": {"NCCL_P2P_DISABLE": "1"}},
    ],
    ids=["nvlink", "topology-unknown", "one-gpu", "p2p-already-off"],
)
def test_no_probe_where_p2p_cannot_hang_the_start(
    tmp_path: Path, changes: dict[str, object]
) -> None:
    probe = Probe(hung())
    decision = decide(probe, tmp_path / "p2p.json", **changes)
    assert probe.calls == 0
    assert decision.env == {} and decision.messages == ()


def test_a_probe_that_cannot_run_is_not_cached_and_changes_nothing(tmp_path: Path) -> None:
    broken = P2PReport(world=2, error="cannot run /nope/python: No such file or directory")
    probe, cache = Probe(broken), tmp_path / "p2p.json"
    decision = decide(probe, cache)
    assert decision.env == {}
    assert decision.messages == (
        "warning [F10]: the P2P probe did not run "
        "(cannot run /nope/python: No such file or directory)",
    )
    assert not cache.exists()
    decide(probe, cache)
    assert probe.calls == 2


def test_the_cache_keeps_only_this_boots_verdicts(tmp_path: Path) -> None:
    probe, cache = Probe(passed()), tmp_path / "p2p.json"
    decide(probe, cache, boot_id="boot-1")
    decide(probe, cache, boot_id="boot-1", gpus=(2, 3))
    assert len(json.loads(cache.read_text())) == 2
    decide(probe, cache, boot_id="boot-2")
    assert list(json.loads(cache.read_text())) == [cache_key("boot-2", PCIE, (0, 1))]


def test_without_a_boot_id_every_launch_probes(tmp_path: Path) -> None:
    probe, cache = Probe(passed()), tmp_path / "p2p.json"
    decide(probe, cache, boot_id=None)
    decide(probe, cache, boot_id=None)
    assert probe.calls == 2 and not cache.exists()


def test_the_plan_gpus_follow_tensor_parallel_and_cuda_visible_devices() -> None:
    assert plan_gpus(resolve(PlanRequest(recipe="dsv4"))) == (0, 1)
    pinned = resolve(PlanRequest(recipe="dsv4", sets=("env.CUDA_VISIBLE_DEVICES=2,3",)))
    assert plan_gpus(pinned) == (2, 3)
    assert plan_gpus(resolve(PlanRequest(recipe="tiny"))) == ()


def test_a_failed_probe_reaches_the_rendered_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # glm47 leaves P2P on (dsv4 and glm52 turn it off in the recipe already).
    plan = resolve(PlanRequest(recipe="glm47", model_dir=str(tmp_path)))
    probe = Probe(hung())

    def decision(plan_: object, python: str) -> P2PDecision:
        return decide(probe, tmp_path / "p2p.json", gpus=plan_gpus(plan))

    monkeypatch.setattr(launcher, "launch_p2p_decision", decision)
    said: list[str] = []
    extra = p2p_gate(plan, sys.executable, said.append)
    spec = start_spec(plan, LaunchOptions(name="glm47"), sys.executable, extra)
    assert spec.env["NCCL_P2P_DISABLE"] == "1"
    assert said and "starting with NCCL_P2P_DISABLE=1" in said[0]
    plain = start_spec(plan, LaunchOptions(name="glm47-b"), sys.executable)
    assert "NCCL_P2P_DISABLE" not in plain.env


def test_the_probe_environment_keeps_multicast_off_and_the_plan_gpus() -> None:
    env = probe_env({"PATH": "/bin", "NCCL_NVLS_ENABLE": "1"}, (2, 3))
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["PATH"] == "/bin"
    assert "CUDA_VISIBLE_DEVICES" not in probe_env({}, None)


def test_an_interpreter_that_does_not_exist_is_a_one_line_error(tmp_path: Path) -> None:
    report = run_p2p_probe(str(tmp_path / "python"), 2, env={})
    assert not report.ok and report.steps == []
    assert report.error == f"cannot run {tmp_path / 'python'}: No such file or directory"


def test_an_interpreter_without_torch_is_named_by_its_own_error() -> None:
    # sm120's own Python has no torch: the probe dies in its first step, and says why.
    report = run_p2p_probe(sys.executable, 2, env=dict(os.environ))
    assert not report.ok and report.failure_id is None  # nothing was learnt about P2P
    assert report.error is not None
    assert report.error.endswith("ModuleNotFoundError: No module named 'torch'")
    assert [step.step for step in report.steps] == ["torch"]
    assert p2p_findings(report)[0].message == f"the P2P probe did not run: {report.error}"


def test_doctor_p2p_without_an_engine_is_refused(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    code, out, err = invoke(cli, "doctor", "--p2p")
    assert code == 2 and out == ""
    assert one_line_error(err) == (
        "Error: --p2p runs in the engine's Python, and none is known (hint: pass "
        "--vllm-python PATH, set VLLM_PYTHON, or run: sm120 engine install)"
    )


def test_doctor_p2p_with_from_is_refused(cli: CliRunner, tmp_path: Path) -> None:
    code, out, err = invoke(cli, "doctor", "--p2p", "--from", str(tmp_path))
    assert code == 2 and out == ""
    assert one_line_error(err) == (
        "Error: --p2p tries this machine's GPUs and cannot be combined with --from (hint: run "
        "'sm120 doctor --p2p' on the machine itself)"
    )
