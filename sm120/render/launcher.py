"""plan -> the environment of a route the image's own entrypoint runs (recipe `launcher`).

The launcher reads knobs, not flags: its literal knobs as the source sets them, the knobs that
carry one of the plan's flags (so `--set max-model-len=...` reaches it), and the knobs for what
sm120 decides itself (checkpoint, served name, address, port). The argv is its command as is.
"""

from __future__ import annotations

import json
from typing import Any

from sm120.plan.resolve import LaunchPlan


def _knob_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def launcher_env(
    plan: LaunchPlan,
    *,
    container_model_dir: str | None = None,
    bind_host: str | None = None,
) -> dict[str, str]:
    """The knobs of `plan`'s launcher; {} for a plan whose command sm120 builds."""
    launcher = plan.launcher
    if launcher is None:
        return {}
    env = dict(launcher.knobs)
    for knob, flag in launcher.from_args.items():
        value = plan.arg(flag)
        if value is not None:
            env[knob] = _knob_text(value)
    serving = launcher.serving
    hub = container_model_dir is None and not plan.model_dir
    location = container_model_dir or plan.model_dir or plan.model.repo or plan.model.served_name
    chosen = {
        serving.model: location,
        serving.revision: plan.model.revision if hub and plan.model.revision else None,
        serving.served_name: plan.model.served_name,
        serving.host: bind_host or plan.host,
        serving.port: str(plan.port),
    }
    env.update({knob: value for knob, value in chosen.items() if knob and value})
    return env
