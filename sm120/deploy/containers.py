"""What the Docker runtime needs before it can start a plan: the image (built or reused), the
model (the tiny one is generated inside the image, since the host may have no torch), the
compile caches, and the rendered container."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error
from sm120.core.paths import sm120_home
from sm120.deploy.warding import warded_socket
from sm120.engine import docker_api
from sm120.engine.runtime.base import LaunchSpec
from sm120.engine.secrets import ensure_api_key, read_api_key
from sm120.engine.tiny_model import TinyModelError, refresh_chat_template
from sm120.images.build import BuildOptions, build
from sm120.plan.resolve import LaunchPlan
from sm120.render.container import ContainerPlacement, container_argv, render_container

Progress = Callable[[str], None]
BUILDER_IN_IMAGE = "/opt/sm120/sm120/engine/tiny_model_builder.py"


class ImageMissing(SM120Error):
    """The image is not built and building it was declined."""


def hf_cache_dir() -> Path:
    explicit = os.environ.get("HF_HOME")
    return Path(explicit).expanduser() if explicit else Path.home() / ".cache" / "huggingface"


def cache_dir_for(image_id: str, plan_hash: str) -> Path:
    """Compile caches keyed by image and plan: a warm start reuses them, while a new image
    (other kernels, other torch) or a new plan (other shapes) never sees a stale one."""
    short = image_id.split(":", 1)[-1][:12]
    return sm120_home() / "cache" / "docker" / f"{short}-{plan_hash}"


def placement(
    plan: LaunchPlan,
    deployment: str,
    image_id: str | None,
    network: str,
    api_key: str | None,
    engine_socket: str | None = None,
) -> ContainerPlacement:
    key = image_id or "unbuilt"
    return ContainerPlacement(
        deployment=deployment,
        cache_dir=cache_dir_for(key, plan.plan_hash),
        hf_cache=hf_cache_dir(),
        network=network,
        api_key=api_key,
        socket_dir=str(Path(engine_socket).parent) if engine_socket else None,
    )


def ensure_image(
    client: Any,
    plan: LaunchPlan,
    network: str,
    confirm: Callable[[str], bool] | None,
    progress: Progress,
) -> str:
    image = docker_api.get_image(client, plan.image_ref)
    if image is not None:
        return str(image.id)
    if plan.image.build == "pull":
        progress(f"pulling {plan.image_ref}")
        return str(client.images.pull(plan.image_ref).id)
    question = f"{plan.image_ref} is not built here. Build it now (first build can take long)?"
    if confirm is not None and not confirm(question):
        raise ImageMissing(
            f"the image {plan.image_ref} is not built", f"build it first: sm120 build {plan.recipe}"
        )
    options = BuildOptions(network="host" if network == "host" else None)
    return build(client, plan, options, progress).image_id


def ensure_tiny_model_in_image(
    client: Any, plan: LaunchPlan, image_id: str, progress: Progress
) -> None:
    if plan.model.generated != "tiny" or not plan.model_dir:
        return
    dest = Path(plan.model_dir)
    if (dest / "config.json").is_file():
        refresh_chat_template(dest, progress)
        return
    progress(f"building the tiny test model in {dest} (inside the image)")
    # The builder writes beside the destination and renames into place: mount the parent.
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        client.containers.run(
            image_id,
            entrypoint=[plan.image.python, "-I", BUILDER_IN_IMAGE],
            command=[f"/out/{dest.name}"],
            volumes={str(dest.parent): {"bind": "/out", "mode": "rw"}},
            network_mode="none",
            remove=True,
            labels={"sm120.purpose": "tiny-model"},
        )
    except Exception as exc:
        raise TinyModelError(
            f"building the tiny model in the image failed: {docker_api._first_line(exc)}",
            f"the image may be broken: sm120 build {plan.recipe} --no-cache rebuilds it",
        ) from exc


def docker_spec(
    client: Any,
    plan: LaunchPlan,
    *,
    deployment: str,
    api_key: str | None,
    network: str,
    confirm: Callable[[str], bool] | None,
    progress: Progress,
) -> LaunchSpec:
    image_id = ensure_image(client, plan, network, confirm, progress)
    ensure_tiny_model_in_image(client, plan, image_id, progress)
    key_file = ensure_api_key(deployment, api_key)
    # The ward on the host holds the port; a --network host container keeps its own.
    socket = warded_socket(plan, deployment) if network != "host" else None
    where = placement(plan, deployment, image_id, network, read_api_key(str(key_file)), socket)
    for cache in (where.cache_dir / name for name in ("vllm", "triton", "flashinfer")):
        cache.mkdir(parents=True, exist_ok=True)
    where.hf_cache.mkdir(parents=True, exist_ok=True)
    run = render_container(plan, where)
    return LaunchSpec.for_plan(
        plan,
        name=deployment,
        argv=tuple(container_argv(plan, network, warded=socket is not None)),
        env=run["environment"],
        api_key_file=str(key_file),
        container=run,
        engine_socket=socket,
    )
