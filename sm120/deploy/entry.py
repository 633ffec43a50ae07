"""The container entrypoint's plan: `sm120 launch`'s own path (checked_plan, the rules,
preflight, the tiny model), fed from the .env compose mounts, and refused when the plan needs
another image than the one it runs in.

compose mounts the project's .env at DOTENV_PATH, so the entrypoint reads the same file
`sm120 launch` reads, keys and all; without it (docker run -e ...) the settings come from the
environment, as compose's env_file passes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.dotenv import read_dotenv
from sm120.core.errors import SM120Error
from sm120.deploy.checked import checked_plan
from sm120.deploy.launcher import model_ready, preflight_or_stop
from sm120.doctor.detect import detect
from sm120.images.facts import ENGINE_PYTHON_FILE
from sm120.images.manifest import MANIFEST_PATH
from sm120.plan.hardware import Hardware
from sm120.plan.request import plan_request
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.catalogue import env_allow_list
from sm120.recipe.envkeys import check_dotenv_keys
from sm120.recipe.knobs import KNOBS
from sm120.render.argv import render_argv
from sm120.render.compose import CONTAINER_MODEL_DIR
from sm120.render.environment import render_env

DOTENV_PATH = "/etc/sm120/.env"
Progress = Callable[[str], None]


class WrongImage(SM120Error):
    """The .env asks for a recipe or engine this image does not carry."""


@dataclass(frozen=True)
class EntryPaths:
    manifest: Path = Path(MANIFEST_PATH)
    dotenv: Path = Path(DOTENV_PATH)
    engine_python: Path = Path(ENGINE_PYTHON_FILE)
    model_dir: Path = Path(CONTAINER_MODEL_DIR)


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        raise WrongImage(
            f"no sm120 manifest at {path}", "run an image 'sm120 build RECIPE' made"
        ) from None
    if not isinstance(data, dict):
        raise WrongImage(f"{path} is not an sm120 manifest", "rebuild the image")
    return data


def refuse_other_image(plan: LaunchPlan, manifest: Mapping[str, Any]) -> None:
    """The image serves the recipe (and variants' engine) it was built for, nothing else."""
    carried = manifest.get("tag") or f"sm120/{manifest.get('recipe')}"
    variant = f" --variant {','.join(plan.variants)}" if plan.variants else ""
    hint = f"build it with 'sm120 build {plan.recipe}{variant} --write-env' and set IMAGE to it"
    if manifest.get("recipe") != plan.recipe:
        raise WrongImage(
            f"this image ({carried}) carries recipe {manifest.get('recipe')}, not "
            f"{plan.recipe}: {plan.recipe} runs in {plan.image_ref}",
            hint,
        )
    engine = manifest.get("engine", {})
    if manifest.get("tag") != plan.image_ref:
        raise WrongImage(
            f"this image ({carried}) carries {engine.get('name')} {engine.get('ref')}; the "
            f"plan ({plan.engine} {plan.image.engine_version}) runs in {plan.image_ref}",
            hint,
        )


def settings(environ: Mapping[str, str], dotenv_path: Path) -> dict[str, str]:
    if dotenv_path.is_file():
        return read_dotenv(dotenv_path)
    return {key: value for key, value in environ.items() if key in KNOBS}


def container_plan(
    environ: Mapping[str, str],
    force: tuple[str, ...],
    paths: EntryPaths,
    progress: Progress,
    *,
    prepare: bool = True,
    hardware: Hardware | None = None,
) -> tuple[list[str], dict[str, str]]:
    """What the engine is exec'd with: argv (engine interpreter by absolute path) and env."""
    dotenv = settings(environ, paths.dotenv)
    recipe = dotenv.get("RECIPE") or environ.get("RECIPE")
    if not recipe:
        raise SM120Error("RECIPE is not set", "set RECIPE=<name> in .env (see .env.example)")
    manifest = read_manifest(paths.manifest)
    # The host path in MODEL_DIR is mounted at /model by compose.yaml.
    model_dir = str(paths.model_dir) if paths.model_dir.is_dir() else None
    dotenv.pop("MODEL_DIR", None)
    request = plan_request(
        recipe,
        environ={k: v for k, v in environ.items() if k.startswith("SM120_")},
        model_dir=model_dir,
        force=force,
        dotenv=dotenv,
    )
    checked = checked_plan(request, hardware or detect())
    plan = checked.plan
    allow = env_allow_list(plan.engine, plan.image.flavour, plan.image.env_allow)
    where = str(paths.dotenv) if paths.dotenv.is_file() else "environment"
    check_dotenv_keys(dotenv, allow, where)
    refuse_other_image(plan, manifest)
    for result in checked.results:
        if result.status == "warn":
            progress(f"warning [{result.id}]: {result.messages[0]}")
    checked.raise_on_failure()
    engine_python = _engine_python(paths.engine_python, plan)
    if prepare:
        preflight_or_stop(plan, engine_python, progress)
        model_ready(plan, engine_python, progress)
    # Inside the container the engine listens on all interfaces; compose publishes the port
    # on the host address the plan asks for (127.0.0.1 by default).
    argv = render_argv(
        plan, python=engine_python, container_model_dir=model_dir, bind_host="0.0.0.0"
    )
    api_key = environ.get("VLLM_API_KEY") or None
    env = render_env(plan, api_key=api_key, container_model_dir=model_dir, bind_host="0.0.0.0")
    return argv, env


def _engine_python(recorded: Path, plan: LaunchPlan) -> str:
    """The absolute path the image's build recorded (as `launch --vllm-python` gives one)."""
    try:
        return recorded.read_text(encoding="utf-8").strip() or plan.image.python
    except OSError:
        return plan.image.python
