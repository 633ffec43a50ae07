"""plan -> the engine's command line, as a list (never a shell string)."""

from __future__ import annotations

import json
from typing import Any

from sm120.core.net import is_loopback
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.catalogue import engine_flags
from sm120.render.kv_tier import kv_tier_argv

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
SGLANG_MODULE = "sglang.launch_server"


def model_location(plan: LaunchPlan, container_model_dir: str | None = None) -> str:
    """Where the engine loads weights from: the mounted folder, the host folder, or the repo."""
    if container_model_dir is not None:
        return container_model_dir
    if plan.model_dir:
        return plan.model_dir
    return plan.model.repo or plan.model.served_name


def _value_text(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _flag_tokens(engine: str, name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, bool):
        if value:
            return [f"--{name}"]
        spec = engine_flags(engine).flags.get(name)
        return [f"--no-{name}"] if spec is not None and spec.negatable else []
    spec = engine_flags(engine).flags.get(name)
    if spec is not None and spec.type == "int_list":
        return [f"--{name}", *(str(item) for item in value)]  # argparse nargs="+"
    return [f"--{name}", _value_text(value)]


def render_argv(
    plan: LaunchPlan,
    *,
    python: str | None = None,
    container_model_dir: str | None = None,
    bind_host: str | None = None,
    uds: str | None = None,
) -> list[str]:
    """The full engine command. `python` replaces the image's interpreter (native runtime);
    `bind_host` replaces the plan's host (inside a container the engine listens on all
    interfaces and the published port carries the plan's address); `uds`: the engine listens
    on that unix socket instead (a warded engine, sm120.plan.ward: its port is the ward's)."""
    if plan.launcher is not None:
        # the image's own entrypoint: its knobs carry the model, address and flags
        # (render/launcher.py), so there is no interpreter to swap and nothing to append
        return list(plan.launcher.command)
    interpreter = python or plan.image.python
    location = model_location(plan, container_model_dir)
    hub = container_model_dir is None and not plan.model_dir and plan.model.repo
    if plan.engine == "vllm":
        argv = [interpreter, "-m", VLLM_MODULE, "--model", location]
    else:
        argv = [interpreter, "-m", SGLANG_MODULE, "--model-path", location]
    if hub and plan.model.revision:
        argv += ["--revision", plan.model.revision]
    argv += ["--served-model-name", plan.model.served_name]
    argv += ["--host", bind_host or plan.host, "--port", str(plan.port)]
    if uds is not None:
        # vLLM then ignores --host and --port (they stay, naming the deployment's port in
        # `ps`): it listens on the socket alone.
        argv += ["--uds", uds]
    for name, value in plan.args:
        argv += _flag_tokens(plan.engine, name, value)
    return argv + kv_tier_argv(plan.kv_tier) + _exposed_server_flags(plan)


# vLLM's API key guards only /v1, /v2, /inference and /cohere; FastAPI's /docs, /redoc and
# /openapi.json (a map of every open route) go with this flag. Added only when the plan's
# address is reachable from other machines, so loopback renders (and their hashes) are as
# they were; the routes that no flag closes are listed in the README's Security section.
_EXPOSED_VLLM_FLAGS = ("disable-fastapi-docs",)


def _exposed_server_flags(plan: LaunchPlan) -> list[str]:
    if plan.engine != "vllm" or is_loopback(plan.host):
        return []
    given = {name for name, _ in plan.args}
    return [f"--{name}" for name in _EXPOSED_VLLM_FLAGS if name not in given]
