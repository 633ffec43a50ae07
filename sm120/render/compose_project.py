"""Several plans plus the gateway -> one compose file (`sm120 compose A B`).

Each engine is today's compose service (render_compose_service), given its own API key from a
compose secret: a fixed shell line reads the key file into the engine's environment (vLLM) or
argv (SGLang) and execs the engine with its argv untouched, so no key is in the compose text.
The gateway runs `python -m sm120.gateway` in static mode from an image that carries sm120.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from sm120.plan.resolve import LaunchPlan
from sm120.render.compose import LOGGING, STOP_GRACE_PERIOD, cache_volumes, render_compose_service

GATEWAY_SERVICE = "gateway"
GATEWAY_KEY = "gateway_key"
# Relative to the compose file: compose resolves them against the project directory.
SECRETS_DIR = "secrets"
BACKENDS_FILE = "gateway-backends.json"
CONTAINER_BACKENDS = "/etc/sm120/gateway-backends.json"
SECRET_MOUNT = "/run/secrets"
KEY_FILE_ENV = "SM120_API_KEY_FILE"
LOOPBACK = "127.0.0.1"

# `$$` is compose's escape for `$`. An empty or unreadable key file stops the engine rather
# than starting it with no key.
_READ_KEY = (
    'KEY="$$(cat "$$SM120_API_KEY_FILE")" && [ -n "$$KEY" ] || '
    '{ echo "sm120: no API key in $$SM120_API_KEY_FILE" >&2; exit 1; }; '
)
KEY_WRAPPERS = {
    "vllm": _READ_KEY + 'VLLM_API_KEY="$$KEY" exec "$$@"',
    "sglang": _READ_KEY + 'exec "$$@" --api-key "$$KEY"',
}


class _NoAliases(yaml.SafeDumper):
    """Services share dicts (the logging settings): each is written out in full, as a reader
    of the file expects, not as YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


@dataclass(frozen=True)
class ComposeMember:
    """One engine service: its name in the compose file and the plan it serves."""

    service: str
    plan: LaunchPlan
    gpu_ids: tuple[int, ...] | None = None
    caches: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GatewaySpec:
    image: str
    # sm120's own Python in that image (sm120.images.facts.gateway.python).
    python: str
    port: int
    # The published address (loopback unless asked).
    host: str = LOOPBACK


def key_secret(service: str) -> str:
    return f"{service}_key"


def backend_url(member: ComposeMember, host_network: bool) -> str:
    """Where the gateway reaches an engine: by service name on compose's network, on
    loopback when every container shares the host's."""
    host = LOOPBACK if host_network else member.service
    return f"http://{host}:{member.plan.port}"


def render_compose_project(
    members: list[ComposeMember], gateway: GatewaySpec, *, host_network: bool = False
) -> str:
    services = {m.service: _engine_service(m, host_network) for m in members}
    services[GATEWAY_SERVICE] = _gateway_service(members, gateway, host_network)
    secrets = [GATEWAY_KEY, *(key_secret(m.service) for m in members)]
    document: dict[str, Any] = {
        "services": services,
        "secrets": {name: {"file": f"./{SECRETS_DIR}/{name}"} for name in sorted(secrets)},
    }
    volumes = sorted({v for m in members for v in cache_volumes(m.caches, m.service).values()})
    if volumes:
        document["volumes"] = {name: None for name in volumes}
    recipes = " ".join(
        m.service if m.service == m.plan.recipe else f"{m.service}={m.plan.recipe}" for m in members
    )
    images = " ".join(sorted({m.plan.recipe for m in members}))
    header = (
        f"# sm120 compose {recipes}: one engine each, and the gateway on "
        f"{gateway.host}:{gateway.port}.\n"
        f"# Keys: {SECRETS_DIR}/ (0600). Build the images first: sm120 build RECIPE for each of "
        f"{images}. Then: docker compose -f FILE up\n"
    )
    return header + yaml.dump(document, Dumper=_NoAliases, sort_keys=False, width=100)


def _engine_service(member: ComposeMember, host_network: bool) -> dict[str, Any]:
    plan = member.plan
    # Each engine keeps its own cache volumes. Shared ones would have dockerd copy the image's
    # files into a new volume for two containers at once, and one of them fails to start
    # ("mkdir ...: file exists", moby/moby#43068); two engines compiling into one cache
    # directory at once would race as well.
    # On the host's network the engine is reachable from the gateway on loopback, and
    # listening anywhere else would expose it.
    service = render_compose_service(
        plan,
        member.caches,
        bind_host=plan.host if host_network else "0.0.0.0",
        cache_owner=member.service,
    )
    secret = key_secret(member.service)
    argv = [*service.pop("entrypoint"), *service.pop("command")]
    wrapped: dict[str, Any] = {
        "image": service.pop("image"),
        "pull_policy": service.pop("pull_policy"),
        "entrypoint": ["/bin/sh", "-c", KEY_WRAPPERS[plan.engine], "sm120-engine"],
        "command": argv,
    }
    wrapped.update(service)
    wrapped["environment"] = {**service["environment"], KEY_FILE_ENV: f"{SECRET_MOUNT}/{secret}"}
    wrapped["labels"] = {**service["labels"], "sm120.service": member.service}
    wrapped["secrets"] = [secret]
    if host_network:
        del wrapped["ports"]
        wrapped["network_mode"] = "host"
    if member.gpu_ids is not None:
        devices = wrapped["deploy"]["resources"]["reservations"]["devices"]
        devices[0] = {
            "driver": "nvidia",
            "device_ids": [str(index) for index in member.gpu_ids],
            "capabilities": ["gpu"],
        }
    return wrapped


def _gateway_service(
    members: list[ComposeMember], gateway: GatewaySpec, host_network: bool
) -> dict[str, Any]:
    listen = gateway.host if host_network else "0.0.0.0"
    service: dict[str, Any] = {
        "image": gateway.image,
        "pull_policy": "never",
        "entrypoint": [gateway.python, "-m", "sm120.gateway"],
        "command": [
            "--host",
            listen,
            "--port",
            str(gateway.port),
            "--backends",
            CONTAINER_BACKENDS,
            "--key-file",
            f"{SECRET_MOUNT}/{GATEWAY_KEY}",
        ],
        "volumes": [f"./{BACKENDS_FILE}:{CONTAINER_BACKENDS}:ro"],
        "secrets": [GATEWAY_KEY, *(key_secret(m.service) for m in members)],
        "depends_on": [m.service for m in members],
        "labels": {"sm120.service": GATEWAY_SERVICE},
        "ports": [f"{gateway.host}:{gateway.port}:{gateway.port}"],
        "healthcheck": {
            "test": [
                "CMD",
                gateway.python,
                "-c",
                "import urllib.request,sys;"
                f"sys.exit(urllib.request.urlopen('http://{LOOPBACK}:{gateway.port}/health')"
                ".status!=200)",
            ],
            "interval": "30s",
            "timeout": "10s",
            "retries": 3,
        },
        "stop_grace_period": STOP_GRACE_PERIOD,
        "logging": LOGGING,
    }
    if host_network:
        del service["ports"]
        service["network_mode"] = "host"
    return service
