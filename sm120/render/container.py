"""plan -> the docker SDK `containers.run` arguments (pure: no Docker, no files touched).

The result is plain JSON-able data so `launch --runtime docker --dry-run --json` can show
exactly what would be asked of Docker; sm120.engine.docker_api turns the few structured fields
(device requests, ulimits) into SDK objects at the last moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.plan.gpu_sets import PLACEMENT_ENV, placed_on
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.restart_policy import parse_restart_policy
from sm120.render.argv import render_argv
from sm120.render.environment import render_env
from sm120.render.kv_tier import kv_tier_disk

CONTAINER_MODEL_DIR = "/model"
HEALTHCHECK_SCRIPT = "/opt/sm120/launch/healthcheck.py"
# Where a warded engine's socket folder is mounted inside its container.
CONTAINER_SOCKET_DIR = "/run/sm120-engine"
CONTAINER_SOCKET = f"{CONTAINER_SOCKET_DIR}/api.sock"
# Where the engines keep what they compile: kept across starts so a warm start skips the
# minutes of torch.compile / Triton / FlashInfer JIT work.
CONTAINER_CACHES = {
    "vllm": "/root/.cache/vllm",
    "triton": "/root/.triton",
    "flashinfer": "/root/.cache/flashinfer",
}
CONTAINER_HF_CACHE = "/root/.cache/huggingface"
# Seed 004's limits for GPU engines: pinned memory without a cap for NCCL, 64 MiB stacks for
# the kernels. A CPU engine needs neither (and raising memlock needs CAP_SYS_RESOURCE).
ULIMITS = (
    {"name": "memlock", "soft": -1, "hard": -1},
    {"name": "stack", "soft": 67108864, "hard": 67108864},
)
SECOND_NS = 1_000_000_000


@dataclass(frozen=True)
class ContainerPlacement:
    """Host-side facts the renderer needs but must not look up itself."""

    deployment: str
    cache_dir: Path
    hf_cache: Path
    # "bridge" publishes the port on the plan's host address; "host" shares the host's
    # network (the engine then binds the plan's address itself).
    network: str = "bridge"
    api_key: str | None = None
    # A warded engine (sm120.plan.ward): the host folder its unix socket is made in. The
    # container then has no network of its own and publishes nothing: sm120's ward on the
    # host holds the port and reaches the engine through this folder.
    socket_dir: str | None = None


def container_name(deployment: str) -> str:
    return f"sm120-{deployment}"


def container_labels(plan: LaunchPlan, deployment: str) -> dict[str, str]:
    return {
        "sm120.deployment": deployment,
        "sm120.recipe": plan.recipe,
        "sm120.variants": ",".join(plan.identity_variants),
        "sm120.plan-hash": plan.plan_hash,
    }


def _inside(plan: LaunchPlan, network: str) -> tuple[str | None, str]:
    """The model folder and the address as the container sees them."""
    bind = plan.host if network == "host" else "0.0.0.0"  # inside the container only
    return (CONTAINER_MODEL_DIR if plan.model_dir else None), bind


def container_argv(plan: LaunchPlan, network: str, *, warded: bool = False) -> list[str]:
    model_dir, bind = _inside(plan, network)
    uds = CONTAINER_SOCKET if warded else None
    return render_argv(plan, container_model_dir=model_dir, bind_host=bind, uds=uds)


def _volumes(plan: LaunchPlan, where: ContainerPlacement) -> dict[str, dict[str, str]]:
    volumes: dict[str, dict[str, str]] = {}
    if plan.model_dir:
        volumes[plan.model_dir] = {"bind": CONTAINER_MODEL_DIR, "mode": "ro"}
    volumes[str(where.hf_cache)] = {"bind": CONTAINER_HF_CACHE, "mode": "rw"}
    for name, inside in CONTAINER_CACHES.items():
        volumes[str(where.cache_dir / name)] = {"bind": inside, "mode": "rw"}
    disk = kv_tier_disk(plan.kv_tier)
    if disk is not None:
        volumes[disk] = {"bind": disk, "mode": "rw"}
    if where.socket_dir is not None:
        volumes[where.socket_dir] = {"bind": CONTAINER_SOCKET_DIR, "mode": "rw"}
    return volumes


def _healthcheck(plan: LaunchPlan, warded: bool) -> dict[str, Any]:
    address = ["--socket", CONTAINER_SOCKET] if warded else ["--port", str(plan.port)]
    return {
        "test": ["CMD", plan.image.python, HEALTHCHECK_SCRIPT, *address],
        "interval": 30 * SECOND_NS,
        "timeout": 10 * SECOND_NS,
        "retries": 3,
        # Big checkpoints load and compile for many minutes before /health answers.
        "start_period": plan.timeouts.ready_s * SECOND_NS,
    }


def _gpu_request(plan: LaunchPlan, environment: dict[str, str]) -> dict[str, Any]:
    """The container's GPUs: a placed plan (launch --gpus 0,1) asks Docker for those devices,
    and the engine inside sees them renumbered from 0, so the variable that pinned it natively
    is dropped rather than pointing at GPUs the container does not have."""
    placed = placed_on(environment)
    if placed is None:
        return {"driver": "nvidia", "count": plan.hardware.gpus, "capabilities": [["gpu"]]}
    del environment[PLACEMENT_ENV]
    ids = [str(index) for index in placed]
    return {"driver": "nvidia", "device_ids": ids, "capabilities": [["gpu"]]}


def docker_restart_policy(restart: str) -> dict[str, str]:
    """Docker's own restart policy for the deployment's container. Under `--restart
    on-failure[:N]` the monitor relaunches a dead container (one breaker, backoff, the reason
    and the last log lines kept), so Docker must not restart it behind the monitor's back; a
    container Docker restarted would also read as not serving. Without a policy the
    container keeps Docker's unless-stopped, as before (it comes back with dockerd)."""
    if parse_restart_policy(restart).on_failure:
        return {"Name": "no"}
    return {"Name": "unless-stopped"}


def render_container(plan: LaunchPlan, where: ContainerPlacement) -> dict[str, Any]:
    warded = where.socket_dir is not None
    argv = container_argv(plan, where.network, warded=warded)
    run: dict[str, Any] = {
        "image": plan.image_ref,
        "name": container_name(where.deployment),
        "entrypoint": argv[:1],
        "command": argv[1:],
        "environment": render_env(
            plan,
            api_key=where.api_key,
            container_model_dir=_inside(plan, where.network)[0],
            bind_host=_inside(plan, where.network)[1],
        ),
        "labels": container_labels(plan, where.deployment),
        "volumes": _volumes(plan, where),
        "restart_policy": docker_restart_policy(plan.monitor.restart),
        "healthcheck": _healthcheck(plan, warded),
        "privileged": False,
        "detach": True,
        # A warded engine needs no network: its API is the socket, its ranks share the
        # container's loopback (a multi-node plan is never warded, sm120.plan.ward).
        "network_mode": "none" if warded else where.network,
    }
    if plan.image.cap_add:
        run["cap_add"] = list(plan.image.cap_add)
    if where.network != "host" and not warded:
        run["ports"] = {f"{plan.port}/tcp": [plan.host, plan.port]}
    if plan.hardware.gpus > 0:
        # CUDA IPC between the tensor-parallel ranks needs the host IPC namespace.
        run["ipc_mode"] = "host"
        run["ulimits"] = [dict(limit) for limit in ULIMITS]
        run["device_requests"] = [_gpu_request(plan, run["environment"])]
    else:
        run["shm_size"] = plan.image.shm_size
    return run
