"""plan -> a docker compose service (the compose file is assembled by the images work)."""

from __future__ import annotations

from typing import Any

from sm120.plan import LaunchPlan
from sm120.render.argv import render_argv
from sm120.render.environment import render_env

CONTAINER_MODEL_DIR = "/model"


def labels(plan: LaunchPlan) -> dict[str, str]:
    return {
        "sm120.recipe": plan.recipe,
        "sm120.variants": ",".join(plan.variants),
        "sm120.plan-hash": plan.plan_hash,
    }


def render_compose_service(plan: LaunchPlan) -> dict[str, Any]:
    argv = render_argv(plan, container_model_dir=CONTAINER_MODEL_DIR, bind_host="0.0.0.0")
    service: dict[str, Any] = {
        "image": plan.image_ref,
        "entrypoint": [argv[0]],
        "command": argv[1:],
        "environment": render_env(plan),
        "ipc": "host",
        "shm_size": plan.image.shm_size,
        "ulimits": {"memlock": -1, "stack": 67108864},
        "labels": labels(plan),
        # Bind the published port to loopback unless the plan asks for another address.
        "ports": [f"{plan.host}:{plan.port}:{plan.port}"],
        "healthcheck": {
            "test": [
                "CMD",
                argv[0],
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
    }
    if plan.model_dir:
        service["volumes"] = [f"{plan.model_dir}:{CONTAINER_MODEL_DIR}:ro"]
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


def render_compose_file(plan: LaunchPlan) -> str:
    """A standalone compose file for one plan: the resolved command baked in, no .env."""
    import yaml  # deferred: renderers stay importable without it

    document = {"services": {"server": render_compose_service(plan)}}
    header = (
        f"# sm120 compose {plan.recipe}: plan {plan.plan_hash}"
        f"{' (variants ' + ','.join(plan.variants) + ')' if plan.variants else ''}.\n"
        f"# Build the image first: sm120 build {plan.recipe}. Then: docker compose -f FILE up\n"
    )
    return header + yaml.safe_dump(document, sort_keys=False, width=100)
