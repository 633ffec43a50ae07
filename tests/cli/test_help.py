"""Snapshot of `sm120 --help` (Typer upgrades have changed help output before) and a guard
that the root command imports none of the heavy modules."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from tests.helpers import GOLDEN_DIR, invoke

SNAPSHOT = GOLDEN_DIR / "help.txt"


def test_help_snapshot(cli: CliRunner, request: object, monkeypatch: object) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # rich wraps help to the terminal width
    monkeypatch.setenv("NO_COLOR", "1")
    code, out, _ = invoke(cli, "--help")
    assert code == 0
    if request.config.getoption("--update-golden"):
        SNAPSHOT.write_text(out)
    assert out == SNAPSHOT.read_text()


def test_help_lists_core_commands(cli: CliRunner) -> None:
    _, out, _ = invoke(cli, "--help")
    for command in ("launch", "recipes", "validate", "schema"):
        assert command in out


def test_root_import_stays_light() -> None:
    code = (
        "import sys, sm120.cli.app; "
        "heavy = [m for m in ('pydantic', 'yaml', 'httpx', 'rich.console') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
