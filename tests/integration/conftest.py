"""Fixtures shared by the real-stack tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, engine_python: Path) -> Path:
    """The tiny random Llama, built once per test session with the engine's own Python."""
    from sm120.engine.tiny_model import ensure_tiny_model

    dest = tmp_path_factory.mktemp("models") / "tiny"
    return ensure_tiny_model(engine_python, dest, lambda _: None)
