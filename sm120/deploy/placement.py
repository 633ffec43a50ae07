"""Before a placed launch: the GPUs exist, the plan fits on that many, and no running
deployment already holds one of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sm120.core.errors import SM120Error
from sm120.deploy.monitoring import monitor_files
from sm120.doctor.detect import detect
from sm120.engine.find import runtime_for
from sm120.engine.state import DeploymentState, list_states
from sm120.measure.target import load_plan
from sm120.monitor.files import load_launch_spec
from sm120.plan.gpu_sets import placed_on, placement_set
from sm120.plan.hardware import Hardware, declared
from sm120.plan.resolve import LaunchPlan


class PlacementError(SM120Error):
    """A GPU set this launch cannot use."""


def check_gpus_exist(ids: tuple[int, ...], detected: int) -> None:
    missing = [index for index in ids if index >= detected]
    if not missing:
        return
    have = "no GPU" if detected == 0 else f"GPUs 0-{detected - 1}"
    raise PlacementError(
        f"--gpus names GPU {placement_set(tuple(missing))}, and this machine has {have}",
        "see 'nvidia-smi -L' for the GPUs there are",
    )


def check_no_overlap(ids: tuple[int, ...], name: str) -> None:
    """Refuse GPUs a running deployment (other than the one being replaced) holds."""
    for state in list_states():
        if state.name == name or not runtime_for(state).status(state).running:
            continue
        held = gpus_held(state)
        if held is None:
            continue
        shared = [index for index in ids if index in held] if held else list(ids)
        if shared:
            where = f"GPUs {placement_set(held)}" if held else "every GPU"
            raise PlacementError(
                f"GPU {placement_set(tuple(shared))} is in use by deployment '{state.name}' "
                f"({where})",
                f"pick other GPUs with --gpus, or stop it: sm120 stop {state.name}",
            )


def _container_devices(container: Mapping[str, Any] | None) -> tuple[int, ...] | None:
    """A placed container's GPUs: the device ids of its GPU request (sm120.render.container)."""
    for request in (container or {}).get("device_requests") or []:
        ids = request.get("device_ids")
        if ids:
            return tuple(int(index) for index in ids)
    return None


def gpus_held(state: DeploymentState) -> tuple[int, ...] | None:
    """The GPUs a running deployment holds: its set, () for every GPU, None for none (CPU)."""
    spec = load_launch_spec(monitor_files(state.name).launch_spec, None)
    if spec is not None:
        placed = placed_on(spec.env) or _container_devices(spec.container)
        if placed is not None:
            return placed
    plan = load_plan(state)
    target = ((plan or {}).get("hardware") or {}).get("target") or {}
    # A plan that is not there to read may use GPUs: it holds them all, to be safe.
    return None if plan is not None and target.get("gpus") == 0 else ()


def placed_hardware(ids: tuple[int, ...], arch: str | None) -> Hardware:
    """What a placed plan is checked against: as many GPUs as it is placed on. With --arch
    the hardware is declared (as with --gpus N) and this machine's GPUs are not looked at."""
    if arch is not None:
        found = declared(len(ids), arch)
        assert found is not None  # arch is given
        return found
    detected = detect()
    check_gpus_exist(ids, detected.gpus if detected else 0)
    assert detected is not None  # check_gpus_exist refused a machine without GPUs
    return Hardware(gpus=len(ids), arch=detected.arch, source="detected")


def check_placeable(plan: LaunchPlan, ids: tuple[int, ...]) -> None:
    if plan.hardware.gpus == 0:
        raise PlacementError(
            f"{plan.recipe} runs on the CPU: --gpus {placement_set(ids)} has nothing to place",
            "leave --gpus out, or pick a GPU variant (sm120 recipes show NAME)",
        )
