"""plan -> a docker compose service (the compose file is assembled by the images work)."""

from __future__ import annotations

import re
from typing import Any

from sm120.plan.resolve import LaunchPlan
from sm120.render.argv import render_argv
from sm120.render.environment import render_env
from sm120.render.kv_tier import kv_tier_disk

CONTAINER_MODEL_DIR = "/model"


def labels(plan: LaunchPlan) -> dict[str, str]:
    return {
        "sm120.recipe": plan.recipe,
        "sm120.variants": ",".join(plan.identity_variants),
        "sm120.plan-hash": plan.plan_hash,
    }


# json-file rotation: an engine at debug level writes gigabytes a day otherwise.
LOGGING = {"driver": "json-file", "options": {"max-size": "100m", "max-file": "5"}}
# SIGTERM to SIGKILL: the engine's workers tear down NCCL and free GPU memory in between.
STOP_GRACE_PERIOD = "2m"


def cache_volumes(caches: dict[str, str], owner: str = "") -> dict[str, str]:
    """Container cache path -> the named volume that keeps it between starts. `owner`: the
    service the volumes belong to, where a file holds several engines (see compose_project)."""
    prefix = f"{owner}-" if owner else ""
    return {
        path: prefix + re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")
        for path in sorted(caches)
    }


def render_compose_service(
    plan: LaunchPlan,
    caches: dict[str, str] | None = None,
    bind_host: str = "0.0.0.0",
    cache_owner: str = "",
) -> dict[str, Any]:
    """`caches`: where the plan's image writes caches (its image.yaml), kept in volumes.
    `bind_host`: where the engine listens inside its container (all of the container's
    addresses, so the published port reaches it). `cache_owner`: names the volumes after
    this service (see cache_volumes)."""
    argv = render_argv(plan, container_model_dir=CONTAINER_MODEL_DIR, bind_host=bind_host)
    service: dict[str, Any] = {
        "image": plan.image_ref,
        # A built image exists only here; a published one may be pulled.
        "pull_policy": "never" if plan.image.build == "dockerfile" else "missing",
        "entrypoint": [argv[0]],
        "command": argv[1:],
        "environment": render_env(
            plan, container_model_dir=CONTAINER_MODEL_DIR, bind_host=bind_host
        ),
        "ipc": "host",
        # For NCCL's pinned memory; a CPU engine has none (dropped below).
        "ulimits": {"memlock": -1, "stack": 67108864},
        "labels": labels(plan),
        # Bind the published port to loopback unless the plan asks for another address.
        "ports": [f"{plan.host}:{plan.port}:{plan.port}"],
        "healthcheck": {
            "test": [
                "CMD",
                # a launcher route's argv[0] is a script: probe with the image's Python
                plan.image.python if plan.launcher else argv[0],
                "-c",
                "import urllib.request,sys;"
                f"sys.exit(urllib.request.urlopen('http://127.0.0.1:{plan.port}/health')"
                ".status!=200)",
            ],
            "interval": "30s",
            "timeout": "10s",
            "retries": 3,
            "start_period": f"{plan.timeouts.ready_s}s",
        },
        "stop_grace_period": STOP_GRACE_PERIOD,
        "logging": LOGGING,
    }
    volumes: list[str | dict[str, Any]] = (
        [_bind(plan.model_dir, CONTAINER_MODEL_DIR, read_only=True)] if plan.model_dir else []
    )
    volumes += [f"{name}:{path}" for path, name in cache_volumes(caches or {}, cache_owner).items()]
    disk = kv_tier_disk(plan.kv_tier)
    if disk is not None:
        volumes.append(_bind(disk, disk))
    if volumes:
        service["volumes"] = volumes
    if plan.image.cap_add:
        service["cap_add"] = list(plan.image.cap_add)
    if plan.hardware.gpus == 0:
        # Docker engines that may not raise rlimits (rootless, user namespaces) refuse a
        # container that asks ("error setting rlimit type 8"), as compose.cpu.yaml knows.
        del service["ulimits"]
    if plan.hardware.gpus > 0:
        service["deploy"] = {
            "resources": {
                "reservations": {
                    "devices": [
                        {"driver": "nvidia", "count": plan.hardware.gpus, "capabilities": ["gpu"]}
                    ]
                }
            }
        }
    return service


def render_compose_file(plan: LaunchPlan, caches: dict[str, str] | None = None) -> str:
    """A standalone compose file for one plan: the resolved command baked in, no .env."""
    import yaml  # deferred: renderers stay importable without it

    document: dict[str, Any] = {"services": {"server": render_compose_service(plan, caches)}}
    if caches:
        document["volumes"] = {name: None for name in cache_volumes(caches).values()}
    # identity_variants: a seed variant's file is the one the default used to write
    named = ",".join(plan.identity_variants)
    header = (
        f"# sm120 compose {plan.recipe}: plan {plan.plan_hash}"
        f"{' (variants ' + named + ')' if named else ''}.\n"
        f"# Build the image first: sm120 build {plan.recipe}. Then: docker compose -f FILE up\n"
    )
    return header + yaml.safe_dump(document, sort_keys=False, width=100)


def _bind(source: str, target: str, read_only: bool = False) -> str | dict[str, Any]:
    """A host folder mounted into the service. The short form `SOURCE:TARGET[:ro]` is split
    on ':', so a path holding one would mount something else ('/x:/etc' mounts /etc): such a
    path gets compose's long form, where each part is its own field."""
    if ":" not in source and ":" not in target:
        return f"{source}:{target}:ro" if read_only else f"{source}:{target}"
    long: dict[str, Any] = {"type": "bind", "source": source, "target": target}
    if read_only:
        long["read_only"] = True
    return long
