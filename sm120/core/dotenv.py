"""Read a compose-style .env file (KEY=VALUE lines) without executing anything."""

from __future__ import annotations

from pathlib import Path

from sm120.core.bounded import read_text_capped
from sm120.core.errors import PlanError, SM120Error

# A .env holds a dozen settings; anything near this size is the wrong file.
MAX_DOTENV_BYTES = 256 * 1024


def read_dotenv(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        text = read_text_capped(path, MAX_DOTENV_BYTES, ".env file", "check --env-file")
    except SM120Error as exc:
        raise PlanError(exc.message, exc.hint) from None
    lines = text.splitlines()
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip().replace("_", "").isalnum():
            shown = raw if len(raw) <= 80 else f"{raw[:80]}..."
            raise PlanError(f"{path}:{number}: expected KEY=VALUE, got '{shown}'", "fix the line")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        values[key.strip()] = value
    return values
