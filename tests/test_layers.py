"""The import contracts of pyproject.toml ([tool.importlinter], the layers of
docs/architecture.md) hold, checked by the real `lint-imports` on the real package."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The repository: found upward, so the file may move under tests/<package>/.
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    beside = Path(sys.executable).with_name("lint-imports")
    binary = str(beside) if beside.is_file() else shutil.which("lint-imports")
    if binary is None:
        pytest.fail("lint-imports is missing: pip install -e '.[dev]' brings import-linter")
    return subprocess.run(
        [binary, "--no-cache", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_every_import_contract_is_kept() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_broken_contract_fails_the_check(tmp_path: Path) -> None:
    """The check can fail: the same checker, with the layers turned upside down, must refuse."""
    config = tmp_path / "upside-down.toml"
    config.write_text(
        "[tool.importlinter]\n"
        'root_package = "sm120"\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "core above cli"\n'
        'type = "layers"\n'
        'layers = ["sm120.core", "sm120.cli"]\n',
        encoding="utf-8",
    )
    result = lint_imports("--config", str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "sm120.cli is not allowed to import sm120.core" in result.stdout
