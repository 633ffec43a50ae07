#!/usr/bin/env python3
"""Container entrypoint: serve the recipe named in the environment, with the same plan the
CLI renders, so `docker compose up` needs nothing but compose.yaml and .env.

compose passes the .env values (RECIPE, VARIANT, PORT, DCP_SIZE, ...) as environment
variables; they are resolved as the .env layer, the rules run, and the engine replaces this
process (exec), so signals and the exit code belong to the engine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from sm120.checks import checked_plan
from sm120.errors import SM120Error
from sm120.hardware import detect
from sm120.plan import PlanRequest
from sm120.render.argv import render_argv
from sm120.render.compose import CONTAINER_MODEL_DIR
from sm120.render.environment import render_env


def container_argv(
    environ: dict[str, str], force: tuple[str, ...] = (), *, prepare: bool = True
) -> tuple[list[str], dict[str, str]]:
    recipe = environ.get("RECIPE")
    if not recipe:
        raise SM120Error("RECIPE is not set", "set RECIPE=<name> in .env (see .env.example)")
    # compose hands the .env over as the environment: all of it is the .env layer, so a
    # misspelled setting is refused here as it is by `sm120 launch`.
    dotenv = dict(environ)
    # The host path in MODEL_DIR is mounted at /model by compose.yaml.
    model_dir = CONTAINER_MODEL_DIR if Path(CONTAINER_MODEL_DIR).is_dir() else None
    dotenv.pop("MODEL_DIR", None)
    request = PlanRequest(recipe=recipe, dotenv=dotenv, model_dir=model_dir, force=force)
    checked = checked_plan(request, detect())
    checked.raise_on_failure()
    # Inside the container the engine listens on all interfaces; compose publishes the port
    # on the host address the plan asks for (127.0.0.1 by default).
    plan = checked.plan
    if prepare and plan.model.generated == "tiny" and model_dir is None and plan.model_dir:
        _ensure_tiny_model(Path(plan.model_dir))
    argv = render_argv(plan, container_model_dir=model_dir, bind_host="0.0.0.0")
    api_key = environ.get("VLLM_API_KEY") or None
    return argv, render_env(plan, api_key=api_key)


def _ensure_tiny_model(dest: Path) -> None:
    """The CPU recipe's model is generated, not downloaded: make it inside the container
    (the image has torch and transformers) unless a mounted /model already holds one."""
    if (dest / "config.json").is_file():
        return
    from sm120.tiny_model import BUILDER_SCRIPT

    sys.stderr.write(f"sm120: building the tiny test model in {dest}\n")
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-I", str(BUILDER_SCRIPT), str(dest)], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--print", action="store_true", help="print argv and env as JSON")
    parser.add_argument("--force", action="append", default=[], help="skip a rule by id")
    options = parser.parse_args()
    try:
        argv, env = container_argv(
            dict(os.environ), tuple(options.force), prepare=not options.print
        )
    except SM120Error as exc:
        sys.stderr.write(f"Error: {exc.one_line()}\n")
        return 2
    if options.print:
        print(json.dumps({"argv": argv, "env": env}, indent=2))
        return 0
    sys.stderr.write(f"sm120: exec {' '.join(argv[:4])} ... ({len(argv)} args)\n")
    os.execvpe(argv[0], argv, {**os.environ, **env})


if __name__ == "__main__":
    sys.exit(main())
