"""Generated docs stay current, and the README's commands are the ones CI runs."""

from __future__ import annotations

from sm120.cli.docs import commands_markdown, readme_with_table
from tests.helpers import REPO


def test_readme_troubleshooting_is_generated_from_the_catalogue() -> None:
    readme = (REPO / "README.md").read_text()
    assert readme == readme_with_table(readme), "run: python -m sm120.cli.docs --write"
    assert "| F09 | " in readme


def test_command_reference_is_current() -> None:
    assert (REPO / "docs" / "commands.md").read_text() == commands_markdown(), (
        "run: python -m sm120.cli.docs --write"
    )


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    test_command = "pip install -e '.[dev]' && pytest"
    assert test_command in readme
    assert "pip install --quiet -e '.[dev]'" in ci
    assert ci.rstrip().endswith("pytest")


def test_readme_main_job_is_the_tiny_launch() -> None:
    readme = (REPO / "README.md").read_text()
    assert "pip install -e . && sm120 launch tiny" in readme
