#!/usr/bin/env python3
"""Container entrypoint: serve the recipe named in .env with `sm120 launch`'s own plan, rules,
refusals and warnings, so `docker compose up` needs nothing but compose.yaml and .env.

It runs with the toolkit's venv Python and execs the engine's interpreter by the absolute
path the image recorded, so the engine replaces this process: signals and the exit code
belong to the engine. A .env naming a recipe or engine this image does not carry is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sm120.core.errors import SM120Error
from sm120.deploy.entry import EntryPaths, container_plan


def _progress(line: str) -> None:
    sys.stderr.write(f"sm120: {line}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--print", action="store_true", help="print argv and env as JSON")
    parser.add_argument("--force", action="append", default=[], help="skip a rule by id")
    options = parser.parse_args()
    paths = EntryPaths(**_path_overrides())
    try:
        argv, env = container_plan(
            dict(os.environ), tuple(options.force), paths, _progress, prepare=not options.print
        )
    except SM120Error as exc:
        sys.stderr.write(f"Error: {exc.one_line()}\n")
        return 2
    if options.print:
        print(json.dumps({"argv": argv, "env": env}, indent=2))
        return 0
    _progress(f"exec {' '.join(argv[:4])} ... ({len(argv)} args)")
    os.execvpe(argv[0], argv, {**os.environ, **env})


def _path_overrides() -> dict[str, Path]:
    """SM120_ENTRY_MANIFEST / _DOTENV / _ENGINE_PYTHON / _MODEL_DIR: where the image keeps
    them, for running this file outside an image (tests)."""
    names = {"manifest": "MANIFEST", "dotenv": "DOTENV", "engine_python": "ENGINE_PYTHON"}
    names["model_dir"] = "MODEL_DIR"
    found: dict[str, Path] = {}
    for field, suffix in names.items():
        value = os.environ.get(f"SM120_ENTRY_{suffix}")
        if value:
            found[field] = Path(value)
    return found


if __name__ == "__main__":
    sys.exit(main())
