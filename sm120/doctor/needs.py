"""What a plan asks of the machine, in the terms the checks use. Without a recipe every
field stays at "nobody said", and the checks judge the machine on its own."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sm120.core.defaults import DEFAULT_HOST, DEFAULT_PORT
from sm120.plan.fit.memory import DEFAULT_GPU_MEMORY_UTILIZATION

if TYPE_CHECKING:
    from sm120.plan.resolve import LaunchPlan

SM12X = ("sm_120", "sm_121")


@dataclass(frozen=True)
class Needs:
    recipe: str | None = None
    gpus: int | None = None  # GPUs the plan uses; 0 for the CPU recipe
    archs: tuple[str, ...] = ()  # compute capabilities it is validated on
    gpu_memory_utilization: float | None = None
    tensor_parallel: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    model_dir: str | None = None
    weights_gb: float | None = None
    shm_bytes: int | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    engine: str | None = None
    # Without a recipe: which recipes (and variants) are validated on each compute capability,
    # so a GPU that is not SM12x is told what would run on it.
    targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # A KV tier beyond the GPU: pinned host RAM (GiB) and LMCache's disk folder and size.
    kv_tier_gib: float | None = None
    kv_tier_disk_path: str | None = None
    kv_tier_disk_gib: float | None = None
    # Sleep mode (level 1) moves the weights into host RAM beside the tier.
    sleep_weights_gb: float | None = None

    @property
    def uses_gpus(self) -> bool:
        return bool(self.gpus)

    @property
    def wants_sm12x(self) -> bool:
        return self.uses_gpus and any(arch in SM12X for arch in self.archs)


def parse_size(text: str) -> int | None:
    """Docker-style sizes: '16gb', '64m', '1g', '512' (bytes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        return None
    scale = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[match.group(2)]
    return int(float(match.group(1)) * scale)


def needs_from_plan(plan: LaunchPlan) -> Needs:
    tp = plan.arg("tensor-parallel-size", 1)
    pp = plan.arg("pipeline-parallel-size", 1)
    utilization = plan.arg("gpu-memory-utilization")
    if utilization is None and plan.engine == "vllm" and plan.hardware.gpus:
        utilization = DEFAULT_GPU_MEMORY_UTILIZATION
    if utilization is None:
        utilization = plan.arg("mem-fraction-static")  # SGLang's name for it
    used = (tp if isinstance(tp, int) else 1) * (pp if isinstance(pp, int) else 1)
    return Needs(
        recipe=plan.recipe,
        gpus=used if plan.hardware.gpus else 0,
        archs=tuple(plan.hardware.compute_caps),
        gpu_memory_utilization=_fraction(utilization),
        tensor_parallel=tp if isinstance(tp, int) else 1,
        env=dict(plan.env),
        model_dir=plan.model_dir,
        weights_gb=plan.model.size_gb,
        shm_bytes=parse_size(plan.image.shm_size),
        host=plan.host,
        port=plan.port,
        engine=plan.engine,
        kv_tier_gib=plan.kv_tier.cpu_gib if plan.kv_tier else None,
        kv_tier_disk_path=plan.kv_tier.disk_path if plan.kv_tier else None,
        kv_tier_disk_gib=plan.kv_tier.disk_gib if plan.kv_tier else None,
        sleep_weights_gb=plan.model.size_gb if plan.arg("enable-sleep-mode") else None,
    )


def _fraction(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
