"""`sm120 launch NAME`, whole: from a `LaunchRequest` to a previewed plan (--dry-run) or a
served one.

The order is the user's protection: everything that can be refused cheaply (rules, GPU
placement, the restart policy, a running deployment of the same name, the preflight) is
refused before the weights are fetched, and the weights are complete before the engine
starts. One host or many is decided here; what the user sees is the caller's `LaunchView`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from sm120.core.errors import SM120Error
from sm120.core.suggest import did_you_mean
from sm120.deploy.checked import CheckedPlan, checked_plan, plan_document
from sm120.deploy.cluster import ClusterRequest
from sm120.deploy.containers import placement as container_placement
from sm120.deploy.gate import GateRequest
from sm120.deploy.launcher import (
    LaunchOptions,
    PreflightPassed,
    preflight_or_stop,
    refuse_without_terminal,
    running_deployment,
)
from sm120.deploy.monitoring import check_restart_policy
from sm120.deploy.placement import check_no_overlap, check_placeable, placed_hardware
from sm120.deploy.serving import ServeView, serve
from sm120.deploy.tuned import NOTHING, tuned_for
from sm120.deploy.warding import warded_socket
from sm120.doctor.detect import detect
from sm120.engine import docker_api
from sm120.engine.cluster.hosts import check_nodes_fit, parse_ssh_options, require_nodes
from sm120.engine.state import check_deployment_name
from sm120.plan.hardware import Hardware, declared
from sm120.plan.resolve import LaunchPlan, PlanRequest
from sm120.recipe.loader import load_recipe
from sm120.render.compose import CONTAINER_MODEL_DIR
from sm120.render.container import render_container
from sm120.render.multinode import NodeAddress, NodeLaunch, render_nodes
from sm120.weights.ensure import with_managed_dir

RUNTIMES = ("native", "docker")
NETWORKS = ("bridge", "host")


@dataclass(frozen=True)
class LaunchRequest:
    """Everything `sm120 launch` was asked, parsed (see cli/launch.py's builder)."""

    plan: PlanRequest
    name: str | None = None  # the deployment's name; the recipe's when None
    gpu_count: int | None = None  # --gpus N: check against N GPUs, not the detected ones
    placement: tuple[int, ...] | None = None  # --gpus 0,1: run on these GPUs
    arch: str | None = None
    dry_run: bool = False
    runtime: str = "native"
    network: str = "bridge"
    nodes: tuple[NodeAddress, ...] | None = None  # --nodes: head first
    ssh_options: tuple[str, ...] = ()
    vllm_python: str | None = None
    api_key: str | None = None
    replace: bool = False
    foreground: bool = False
    timeout_s: float | None = None
    yes: bool = False
    monitor: bool = True
    gate: GateRequest | None = None
    use_tuned: bool = True  # --no-tuned: leave `sm120 tune`'s result for this host aside

    def __post_init__(self) -> None:
        # Checked with the request, so a dry run refuses what a real start would.
        parse_ssh_options(self.ssh_options)


@dataclass(frozen=True)
class Prepared:
    """A launch checked as far as it can be without starting anything."""

    request: LaunchRequest
    # The plan request again when launch chose where the weights go (sm120's own folder).
    plan_request: PlanRequest
    checked: CheckedPlan
    launches: list[NodeLaunch] | None = None
    tuned_line: str | None = None  # where the tuned settings came from, or why none apply


class LaunchView(ServeView, Protocol):
    """What the user sees of a launch, beside serving itself."""

    def preview(self, prepared: Prepared) -> None:
        """--dry-run: show the plan (`preview_document` is its JSON form)."""

    def asker(self) -> Callable[[str], bool] | None:
        """How to ask the user a yes/no question, or None when nobody can be asked."""

    def fetch_weights(self, plan: LaunchPlan, yes: bool) -> Path | None:
        """Make the plan's checkpoint complete; the folder when anything was fetched."""


def launch(request: LaunchRequest, view: LaunchView, started_at: float | None = None) -> int:
    """Preview the plan (--dry-run) or serve it; the launch's exit code. `started_at`
    (time.monotonic()) is where the launch's wall-time split begins: now, unless given."""
    started = time.monotonic() if started_at is None else started_at
    prepared = prepare(request)
    if prepared.tuned_line:
        view.line(prepared.tuned_line)
    if request.dry_run:
        view.preview(prepared)
        return 1 if prepared.checked.failed else 0
    return _serve(prepared, view, started)


def prepare(request: LaunchRequest) -> Prepared:
    """Hardware, the checked plan, placement, restart policy, the nodes and where the
    weights go: everything --dry-run shows and a launch needs first."""
    if request.name is not None:
        check_deployment_name(request.name)  # --dry-run refuses what a launch would
    hardware = declared(request.gpu_count, request.arch)
    if request.placement is not None:
        hardware = placed_hardware(request.placement, request.arch)
    # Nodes of a multi-node plan are checked one by one at launch, not against this machine.
    if hardware is None and not request.dry_run and request.nodes is None:
        hardware = detect() or Hardware(gpus=0, arch="cpu", source="detected")
    check_runtime(request.runtime, request.network)
    checked = checked_plan(request.plan, hardware)
    tuned = NOTHING
    if request.use_tuned and request.nodes is None:
        tuned = tuned_for(checked.plan)
        if tuned.sets:
            request = replace(request, plan=replace(request.plan, tuned=tuned.sets))
            checked = checked_plan(request.plan, checked.hardware)
    if request.placement is not None:
        check_placeable(checked.plan, request.placement)
    check_restart_policy(checked.plan, monitor=request.monitor)
    if request.nodes is not None:
        launches = node_launches(checked, list(request.nodes), request.runtime)
        return Prepared(request, request.plan, checked, launches)
    # The weights of a multi-node plan sit at one path on every node: no local default.
    plan_request, checked = _weights_dir(request.plan, checked)
    return Prepared(request, plan_request, checked, tuned_line=tuned.line)


def check_runtime(runtime: str, network: str) -> None:
    if runtime not in RUNTIMES:
        raise SM120Error(
            f"unknown runtime '{runtime}'{did_you_mean(runtime, RUNTIMES)}",
            "use --runtime native or --runtime docker",
        )
    if network not in NETWORKS:
        raise SM120Error(
            f"unknown Docker network mode '{network}'{did_you_mean(network, NETWORKS)}",
            "use --network bridge (publish the port) or --network host",
        )


def preview_document(prepared: Prepared) -> dict[str, Any]:
    """The --dry-run --json document: the plan, and the nodes or the container if any."""
    request, checked = prepared.request, prepared.checked
    document = plan_document(checked)
    if prepared.launches is not None:
        document["nodes"] = [launch.as_dict() for launch in prepared.launches]
    elif request.runtime == "docker":
        document["container"] = container_preview(checked.plan, request.name, request.network)
    return document


def container_preview(plan: LaunchPlan, name: str | None, network: str) -> dict[str, object]:
    """The containers.run arguments launch would use; the image id is looked up if Docker is
    reachable, and the API key is never shown (it is generated at launch)."""
    image_id = None
    # A dry run must not need Docker: without it the cache path says "unbuilt".
    with contextlib.suppress(docker_api.DockerUnavailable):
        found = docker_api.get_image(docker_api.connect(), plan.image_ref)
        image_id = str(found.id) if found is not None else None
    deployment = name or plan.recipe
    socket = warded_socket(plan, deployment, create=False) if network != "host" else None
    where = container_placement(plan, deployment, image_id, network, None, socket)
    return render_container(plan, where)


def node_launches(
    checked: CheckedPlan, addresses: list[NodeAddress], runtime: str
) -> list[NodeLaunch]:
    plan = checked.plan
    check_nodes_fit(plan, load_recipe(plan.recipe), addresses)
    docker = runtime == "docker" and plan.model_dir
    return render_nodes(
        plan, addresses, container_model_dir=CONTAINER_MODEL_DIR if docker else None
    )


def confirm_for(request: LaunchRequest, view: LaunchView) -> Callable[[str], bool] | None:
    """--yes agrees to everything; otherwise the view asks, or refuses with no terminal."""
    if request.yes:
        return None
    return view.asker() or refuse_without_terminal


def launch_options(
    request: LaunchRequest,
    plan: LaunchPlan,
    view: LaunchView,
    preflight: PreflightPassed | None = None,
) -> LaunchOptions:
    """The one place a launch's options are built, for one host and for many."""
    return LaunchOptions(
        name=request.name or plan.recipe,
        vllm_python=request.vllm_python,
        api_key=request.api_key,
        replace=request.replace,
        timeout_s=request.timeout_s,
        confirm=confirm_for(request, view),
        docker_network=request.network,
        monitor=request.monitor,
        preflight=preflight,
    )


def _serve(prepared: Prepared, view: LaunchView, started: float | None = None) -> int:
    request, checked = prepared.request, prepared.checked
    if request.nodes is None:
        require_nodes(checked.plan)
    checked.raise_on_failure()
    cluster = None
    passed = None
    if request.nodes is not None:
        if request.gate is not None:
            raise SM120Error("--gate is for one host", "run 'sm120 test' once READY instead")
        cluster = ClusterRequest(list(request.nodes), request.runtime, request.ssh_options)
    else:
        passed, checked = _before_start(prepared, view)
    options = launch_options(request, checked.plan, view, passed)
    # The launch's clock starts here, so its split counts the plan, preflight and weights too.
    options.started_at = started
    return serve(
        checked,
        options,
        view=view,
        runtime=request.runtime,
        foreground=request.foreground,
        gate=request.gate,
        cluster=cluster,
    )


def _before_start(
    prepared: Prepared, view: LaunchView
) -> tuple[PreflightPassed | None, CheckedPlan]:
    """One host: refuse what would not run here, then make the weights complete."""
    request, checked = prepared.request, prepared.checked
    name = request.name or checked.plan.recipe
    # A second launch of a running deployment is refused before anything long starts.
    replacing = running_deployment(name, request.replace) is not None
    if request.placement is not None:
        check_no_overlap(request.placement, name)
    passed = None
    # Will it run here at all, before fetching hundreds of GB of weights for it. Declared
    # hardware (--gpus N/--arch) replaces what this machine has, so its checks are moot then.
    if request.gpu_count is None and request.arch is None:
        passed = preflight_or_stop(checked.plan, None, view.line, replacing=replacing)
    return passed, _complete_weights(prepared.plan_request, checked, request.yes, view)


def _weights_dir(request: PlanRequest, checked: CheckedPlan) -> tuple[PlanRequest, CheckedPlan]:
    """With no model dir chosen, a downloadable checkpoint lives in sm120's folder for it."""
    managed = with_managed_dir(request, checked.plan)
    if managed is None:
        return request, checked
    return managed, checked_plan(managed, checked.hardware)


def _complete_weights(
    request: PlanRequest, checked: CheckedPlan, yes: bool, view: LaunchView
) -> CheckedPlan:
    """Serve complete weights: fetch what is missing (asking unless --yes), then resolve
    again so values derived from the checkpoint's config.json enter the plan."""
    if view.fetch_weights(checked.plan, yes) is None:
        return checked
    again = checked_plan(request, checked.hardware)
    again.raise_on_failure()
    return again
