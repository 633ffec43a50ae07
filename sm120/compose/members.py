"""Which services a `sm120 compose A B` project has, and the refusals that keep them apart:
one name, one published port and one model per service, and no GPU two services hold."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sm120.compose.request import ComposeRequest
from sm120.core.errors import SM120Error
from sm120.images.facts import TOOLKIT_PYTHON
from sm120.plan.gpu_sets import DEVICE_PREFIX, parse_gpu_set, placement_set
from sm120.plan.request import plan_request
from sm120.plan.resolve import LaunchPlan, resolve
from sm120.render.compose_project import GATEWAY_SERVICE, ComposeMember, GatewaySpec

# Compose service names; they are also hostnames on the project's network and file names.
_SERVICE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
MAX_PORT = 65535


class ComposeError(SM120Error):
    """A compose project that cannot be written as asked."""


@dataclass(frozen=True)
class ComposeProject:
    members: list[ComposeMember]
    gateway: GatewaySpec
    host_network: bool


def build_project(
    request: ComposeRequest, caches_of: Callable[[LaunchPlan], dict[str, str]]
) -> ComposeProject:
    """Resolve each recipe's plan and refuse a project whose services would collide."""
    named = _named_specs(request.recipes)
    ports = _by_service(request.ports, "--ports", "NAME=PORT", named)
    placements = _by_service(request.gpus, "--gpus", "NAME=GPUS", named)
    members = []
    for service, (recipe, served) in named.items():
        plan = resolve(
            plan_request(
                recipe,
                environ=request.environ,
                port=_port(service, ports[service]) if service in ports else None,
                served_name=served,
                dotenv={},
            )
        )
        gpu_ids = _gpu_set(service, plan, placements.get(service))
        members.append(ComposeMember(service, plan, gpu_ids, caches_of(plan)))
    _check_ports(members, request.gateway_port)
    _check_models(members)
    _check_gpus(members)
    spec = GatewaySpec(
        _gateway_image(members), TOOLKIT_PYTHON, request.gateway_port, request.gateway_host
    )
    return ComposeProject(members, spec, request.host_network)


def _named_specs(specs: tuple[str, ...]) -> dict[str, tuple[str, str | None]]:
    """service -> (recipe, model name it serves: the NAME when one was given)."""
    named: dict[str, tuple[str, str | None]] = {}
    for spec in specs:
        name, sep, recipe = spec.partition("=")
        if not sep:
            name, recipe = spec, spec
        if not _SERVICE_NAME.match(name):
            raise ComposeError(
                f"'{spec}': service name '{name}' must be lowercase letters, digits, - or _",
                "name it before the recipe: sm120 compose tiny fast=tiny",
            )
        if name == GATEWAY_SERVICE:
            raise ComposeError(
                f"'{spec}': the service name '{GATEWAY_SERVICE}' is the gateway's",
                f"name it another way: sm120 compose other={recipe}",
            )
        if name in named:
            raise ComposeError(
                f"service '{name}' is named twice",
                f"name each one, and each serves its name: sm120 compose {recipe} {name}2={recipe}",
            )
        named[name] = (recipe, name if sep else None)
    return named


def _by_service(
    pairs: tuple[str, ...], option: str, shape: str, named: Mapping[str, object]
) -> dict[str, str]:
    found: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not value:
            raise ComposeError(f"{option} expects {shape}, got '{pair}'", f"e.g. {option} fast=...")
        if name not in named:
            raise ComposeError(
                f"{option} names service '{name}', which is not in this compose",
                f"services: {', '.join(named)}",
            )
        found[name] = value
    return found


def _port(service: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_PORT:
        raise ComposeError(
            f"--ports {service}={text}: not a port", f"a number from 1 to {MAX_PORT}"
        )
    return int(text)


def _gpu_set(service: str, plan: LaunchPlan, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    if plan.hardware.gpus == 0:
        raise ComposeError(
            f"service {service} runs on the CPU (recipe {plan.recipe}): no GPUs to place",
            f"leave --gpus {service}=... out",
        )
    ids = parse_gpu_set(text.removeprefix(DEVICE_PREFIX), text)
    if len(ids) != plan.hardware.gpus:
        raise ComposeError(
            f"--gpus {service}={text} names {len(ids)} GPU(s) but recipe {plan.recipe} "
            f"runs on {plan.hardware.gpus}",
            f"name {plan.hardware.gpus} GPU indexes, e.g. --gpus {service}="
            + placement_set(tuple(range(plan.hardware.gpus))),
        )
    return ids


def _check_ports(members: list[ComposeMember], gateway_port: int) -> None:
    taken: dict[int, str] = {gateway_port: GATEWAY_SERVICE}
    for member in members:
        holder = taken.get(member.plan.port)
        if holder == GATEWAY_SERVICE:
            raise ComposeError(
                f"service {member.service} uses port {member.plan.port}, the gateway's",
                f"move one: --ports {member.service}=PORT or --gateway-port PORT",
            )
        if holder is not None:
            raise ComposeError(
                f"services {holder} and {member.service} both use port {member.plan.port}",
                f"give one another port: --ports {member.service}=PORT",
            )
        taken[member.plan.port] = member.service


def _check_models(members: list[ComposeMember]) -> None:
    served: dict[str, str] = {}
    for member in members:
        model = member.plan.model.served_name
        if model in served:
            raise ComposeError(
                f"services {served[model]} and {member.service} both serve model '{model}'",
                f"name one, and it serves that name: NAME={member.plan.recipe}",
            )
        served[model] = member.service


def _check_gpus(members: list[ComposeMember]) -> None:
    """Two services may not hold one GPU: with more than one GPU service, each needs its set,
    and the sets must be disjoint. (Whether each plan fits its GPUs' memory is preflight's
    to say when the containers start: the compose file may be written on another machine.)"""
    on_gpus = [m for m in members if m.plan.hardware.gpus > 0]
    unplaced = [m.service for m in on_gpus if m.gpu_ids is None]
    if len(on_gpus) > 1 and unplaced:
        first, second = on_gpus[0].service, on_gpus[1].service
        raise ComposeError(
            f"services {first} and {second} would share the GPUs: --gpus does not split them",
            f"give each its own GPUs: --gpus {first}=0,1 --gpus {second}=2,3",
        )
    holders: dict[int, str] = {}
    for member in on_gpus:
        for index in member.gpu_ids or ():
            if index in holders:
                raise ComposeError(
                    f"--gpus gives GPU {index} to both {holders[index]} and {member.service}",
                    "give each service its own GPUs",
                )
            holders[index] = member.service


def _gateway_image(members: list[ComposeMember]) -> str:
    """The gateway runs in an image sm120 built, since those carry sm120 itself."""
    for member in members:
        if member.plan.image.build == "dockerfile":
            return member.plan.image_ref
    raise ComposeError(
        "no recipe here runs an image sm120 builds, so the gateway has none to run in",
        "add a recipe whose image is built with 'sm120 build' (they carry sm120)",
    )
