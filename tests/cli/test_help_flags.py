"""No `--help` shows a value type beside a flag (`--yes <bool>` reads as if it took one)."""

from __future__ import annotations

from typing import Any

import typer.main
from typer.testing import CliRunner

from sm120.cli.app import app


def every_command_path() -> list[list[str]]:
    root = typer.main.get_command(app)
    paths: list[list[str]] = [[]]

    # Typer 0.29 carries its own copy of Click, so groups are told by their subcommands.
    def walk(command: Any, path: list[str]) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                paths.append([*path, name])
                walk(sub, [*path, name])

    walk(root, [])
    return paths


def test_no_help_shows_a_type_beside_a_flag() -> None:
    runner = CliRunner()
    paths = every_command_path()
    assert len(paths) > 20  # the walk reached the subcommands
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "120"})
        assert result.exit_code == 0, path
        assert "<bool>" not in result.stdout, path
        assert "--help" in result.stdout, path


def test_options_that_take_values_keep_their_type() -> None:
    result = CliRunner().invoke(app, ["logs", "--help"], env={"COLUMNS": "120"})
    assert "--lines    -n      <int>" in result.stdout
