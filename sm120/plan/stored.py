"""A resolved plan as JSON data and back, unchanged: what a relaunch starts again from.

A relaunch must start what was launched, not what the recipe files say by then, so the plan
itself is kept rather than the request that resolved it (which also held the whole
environment). Pure: no I/O; the caller writes the data where it belongs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from sm120.core.errors import PlanError
from sm120.core.records import field_values
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.schema import (
    Baseline,
    HardwareSpec,
    ImageSpec,
    KvTier,
    Launcher,
    ModelSource,
    MonitorSpec,
    MultiNode,
    Published,
    SmokeSpec,
    Timeouts,
)

# Bumped when a field changes meaning; an older file is refused, never half-read.
STORED_PLAN_FORMAT = 1
MODEL_FIELDS: dict[str, type[BaseModel]] = {
    "image": ImageSpec,
    "model": ModelSource,
    "hardware": HardwareSpec,
    "baseline": Baseline,
    "timeouts": Timeouts,
    "smoke": SmokeSpec,
    "monitor": MonitorSpec,
    "multinode": MultiNode,
    "published": Published,
    "kv_tier": KvTier,
    "launcher": Launcher,
}
PAIR_FIELDS = ("args", "env")
MAPPING_FIELDS = ("why", "derived", "provenance")


def plan_to_data(plan: LaunchPlan) -> dict[str, Any]:
    data: dict[str, Any] = {"format": STORED_PLAN_FORMAT}
    for item in dataclasses.fields(plan):
        value = getattr(plan, item.name)
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        elif item.name in PAIR_FIELDS:
            value = [[key, entry] for key, entry in value]
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        data[item.name] = value
    return data


def plan_from_data(data: object) -> LaunchPlan:
    """The plan plan_to_data saw; PlanError when the data is not one."""
    if not isinstance(data, dict) or data.get("format") != STORED_PLAN_FORMAT:
        raise _unusable("it is not a plan this sm120 wrote")
    try:
        return LaunchPlan(**field_values(LaunchPlan, data, _field_value))
    except (ValidationError, TypeError, ValueError) as exc:
        raise _unusable(str(exc).splitlines()[0]) from None


def _field_value(name: str, value: Any) -> Any:
    if name in MODEL_FIELDS:
        return None if value is None else MODEL_FIELDS[name].model_validate(value)
    if name in PAIR_FIELDS:
        return tuple((str(key), entry) for key, entry in value)
    if name in MAPPING_FIELDS:
        return dict(value)
    if isinstance(value, list):
        return tuple(value)
    return value


def _unusable(problem: str) -> PlanError:
    return PlanError(f"the saved plan is unusable: {problem}", "launch the deployment again")
