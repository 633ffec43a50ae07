"""A stand-in engine for `sm120 launch` (native runtime): an "engine Python" that runs
tests/fakes/standin_engine.py in place of vLLM's API server.

The launcher's preflight asks that Python which vLLM and torch it has (sm120/doctor's probe
runs for real); a site folder with their package metadata answers it, nothing more.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from sm120.engine.runtime.base import LaunchSpec
from tests.helpers import DATA_DIR

STANDIN = Path(__file__).resolve().parent / "standin_engine.py"
FATAL_STARTUPS = DATA_DIR / "fatal_startups"
VLLM_LOGS = DATA_DIR / "vllm_logs"

ENGINE_PYTHON = """#!/bin/bash
# The engine's Python stand-in: the launcher's own scripts (-c, -I) run on the real interpreter
# with the stand-in's package metadata; the engine command runs the stand-in engine.
export PYTHONPATH={site}
case "$1" in
  -c|-I) exec {python} "$@";;
esac
export STANDIN_LOG={log}
export STANDIN_DELAY={delay}
exec {python} {standin} "$@"
"""


def _metadata(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def make_engine_python(folder: Path, log: Path, delay: float = 0.02) -> Path:
    """An executable to pass as --vllm-python; its engine prints `log` and hangs."""
    site = folder / "standin-site"
    _metadata(site, "vllm", "0.32.0")
    _metadata(site, "torch", "2.13.0+cpu")
    (site / "torch").mkdir(exist_ok=True)
    (site / "torch" / "version.py").write_text('__version__ = "2.13.0+cpu"\ncuda = None\n')
    python = folder / "engine-python"
    python.write_text(
        ENGINE_PYTHON.format(
            site=site, python=sys.executable, log=log, delay=delay, standin=STANDIN
        )
    )
    python.chmod(0o755)
    return python


def make_model_dir(folder: Path) -> Path:
    """A model folder the launcher takes as the tiny model (it only looks at config.json)."""
    model = folder / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    return model


# The one line `sm120 launch` ends with when the log showed the start-up is lost:
# seconds into the wait, phase, the failure named, the hint.
FAILURE_LINE = re.compile(
    r"Error: the engine failed (\d+) s into its start-up \(phase: (\w+)\): (.*) \(hint: (.*)\)"
)


def spec_for(tmp_path: Path, script: str, name: str = "demo", **env: str) -> LaunchSpec:
    script_path = tmp_path / f"{name}_engine.py"
    script_path.write_text(script)
    return LaunchSpec(
        name=name,
        recipe="test-recipe",
        argv=(sys.executable, str(script_path)),
        env=env,
        host="127.0.0.1",
        port=18000,
        plan_hash="hash-1",
        served_model_name="tiny",
        model_dir=None,
        api_key_file=None,
    )
