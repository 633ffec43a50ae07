"""What the GPUs say about frozen counters. Pure: readings in, a judgement out.

Frozen counters with requests in flight have two causes that look the same from /metrics:
- a wedge (F22): the engine waits on something that will never come (a lost broadcast, an
  NCCL peer that died); the GPUs sit near idle power;
- a livelock: a kernel spins without producing tokens (e.g. the sparse-MLA decode livelock:
  GPU at 100 %, no tokens); the GPUs draw high power for as long as it lasts.
A compile (F21) also freezes the counters with the GPUs busy or idle; the watchdog's compile
window covers it before these readings are asked.

Every threshold lives here, with the reason for its value.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from sm120.engine.gpu_readings import GpuReading

# A card with weights loaded and nothing to do draws roughly a tenth of its power limit
# (fans, memory clocks); a quarter of the limit leaves room for that while staying far
# below what real compute draws. Power is the better witness than utilisation: an NCCL
# spin-wait shows 100 % "utilisation" (a kernel is resident) at near idle power.
IDLE_POWER_FRACTION = 0.25
# Utilisation is the fallback witness when a card reports no power (GB10, some vGPUs).
IDLE_UTIL_PCT = 5.0
# Busy: a kernel is resident nearly all the time, or the card draws most of its budget.
BUSY_UTIL_PCT = 90.0
BUSY_POWER_FRACTION = 0.60
# Frozen counters with busy GPUs for this long is a livelock. Well beyond any compile
# window the log does not announce: the longest silent warm-ups seen (first-request
# autotune on big MoE models) stay under a few minutes.
DEFAULT_LIVELOCK_S = 300.0


class GpuState(str, Enum):
    unknown = "unknown"
    """No readings: no GPU, no driver, or a source that failed this poll."""
    idle = "idle"
    """Every GPU near idle power."""
    busy = "busy"
    """At least one GPU busy at high utilisation or power."""
    between = "between"
    """Neither: some work, not enough to call it either."""


def gpu_is_idle(gpu: GpuReading) -> bool:
    if gpu.power_w is not None and gpu.power_limit_w:
        return gpu.power_w < IDLE_POWER_FRACTION * gpu.power_limit_w
    return gpu.util_pct is not None and gpu.util_pct < IDLE_UTIL_PCT


def gpu_is_busy(gpu: GpuReading) -> bool:
    if gpu_is_idle(gpu):
        return False
    if gpu.util_pct is not None and gpu.util_pct >= BUSY_UTIL_PCT:
        return True
    return bool(
        gpu.power_w is not None
        and gpu.power_limit_w
        and gpu.power_w >= BUSY_POWER_FRACTION * gpu.power_limit_w
    )


def gpu_state(readings: Sequence[GpuReading]) -> GpuState:
    # A card that reports neither power nor utilisation says nothing either way.
    known = [g for g in readings if g.util_pct is not None or g.power_w is not None]
    if not known:
        return GpuState.unknown
    if any(gpu_is_busy(g) for g in known):
        # One rank spinning while the others wait for it is still a spin.
        return GpuState.busy
    if all(gpu_is_idle(g) for g in known):
        return GpuState.idle
    return GpuState.between


def describe_gpus(readings: Sequence[GpuReading]) -> str:
    """`GPU0 98% 512 W, GPU1 97% 505 W` for alerts."""
    parts = []
    for gpu in readings:
        util = "-" if gpu.util_pct is None else f"{gpu.util_pct:.0f}%"
        power = "-" if gpu.power_w is None else f"{gpu.power_w:.0f} W"
        parts.append(f"GPU{gpu.index} {util} {power}")
    return ", ".join(parts) or "no GPU readings"
