"""Generated parts of the docs, kept in sync by tests:
the README's troubleshooting table (from the failure catalogue) and docs/commands.md (from
the CLI). Refresh both with: python -m sm120.cli.docs --write
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from sm120.logs.failures import load_catalogue

REPO = Path(__file__).resolve().parents[2]  # sm120/cli/docs.py -> the repository
BEGIN = "<!-- troubleshooting:begin (generated from sm120/data/failures.yaml) -->"
END = "<!-- troubleshooting:end -->"


def troubleshooting_table() -> str:
    rows = ["| id | symptom | fix |", "|---|---|---|"]
    for mode in load_catalogue().values():
        rows.append(f"| {mode.id} | {mode.title} | {mode.fix} |".replace("\n", " "))
    return "\n".join(rows)


def readme_with_table(readme: str) -> str:
    block = f"{BEGIN}\n{troubleshooting_table()}\n{END}"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    return pattern.sub(lambda _: block, readme)


def commands_markdown() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "typer", "sm120.cli.app", "utils", "docs", "--name", "sm120"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "100", "NO_COLOR": "1"},
    )
    return result.stdout


def main() -> None:
    if "--write" not in sys.argv:
        sys.exit("usage: python -m sm120.cli.docs --write")
    readme = REPO / "README.md"
    readme.write_text(readme_with_table(readme.read_text()))
    (REPO / "docs" / "commands.md").write_text(commands_markdown())


if __name__ == "__main__":
    main()
