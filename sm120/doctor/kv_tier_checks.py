"""Will the host hold the plan's KV tier? The tier is pinned host RAM (it cannot be swapped
out, and the kernel swaps everything else out to make room for it), so it must fit in what is
available now beside the weights sleep mode would move there; LMCache's disk tier needs its
folder and the space."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from sm120.doctor.findings import Finding
from sm120.doctor.host_checks import DiskUsage, nearest_existing, parse_meminfo
from sm120.doctor.needs import Needs
from sm120.plan.fit.sleep import HOST_RAM_RESERVE_GIB

GIB = 1024**3
GB = 1000**3


def check_kv_tier_memory(meminfo: str | None, needs: Needs) -> list[Finding]:
    if needs.kv_tier_gib is None:
        return []
    available = parse_meminfo(meminfo or "").get("MemAvailable")
    if available is None:
        return [Finding("kv-tier-memory", "warn", "host RAM unknown: the KV tier is unchecked")]
    sleeping = (needs.sleep_weights_gb or 0.0) * GB
    needed = needs.kv_tier_gib * GIB + sleeping + HOST_RAM_RESERVE_GIB * GIB
    parts = f"the KV tier pins {needs.kv_tier_gib:g} GiB"
    if sleeping:
        parts += f", sleep mode moves {sleeping / GIB:.1f} GiB of weights there"
    data = {"needed_bytes": int(needed), "available_bytes": available}
    text = (
        f"{parts}, {HOST_RAM_RESERVE_GIB:g} GiB kept free: {needed / GIB:.1f} GiB of host RAM, "
        f"{available / GIB:.1f} GiB available"
    )
    if needed > available:
        return [
            Finding(
                "kv-tier-memory",
                "error",
                text + " (the host would swap)",
                f"lower kv_tier.cpu_gib to at most "
                f"{max(0.0, (available - needed) / GIB + needs.kv_tier_gib):.0f}",
                data=data,
            )
        ]
    return [Finding("kv-tier-memory", "ok", text, data=data)]


def check_kv_tier_disk(
    needs: Needs,
    disk_usage: DiskUsage,
    writable: Callable[[str], bool] = lambda path: os.access(path, os.W_OK),
) -> list[Finding]:
    if needs.kv_tier_disk_path is None or needs.kv_tier_disk_gib is None:
        return []
    folder = Path(needs.kv_tier_disk_path)
    problem = _not_a_folder(folder)
    if problem is not None:
        return [Finding("kv-tier-disk", "error", problem[0], problem[1])]
    if not writable(str(folder)):
        return [Finding("kv-tier-disk", "error", f"{folder} is not writable", "chown or chmod it")]
    free = int(disk_usage(str(nearest_existing(folder))).free)
    wanted = int(needs.kv_tier_disk_gib * GIB)
    text = (
        f"the KV tier's disk wants {needs.kv_tier_disk_gib:g} GiB at {folder}, "
        f"{free / GIB:.1f} GiB free"
    )
    data = {"path": str(folder), "free_bytes": free, "wanted_bytes": wanted}
    if wanted > free:
        return [
            Finding(
                "kv-tier-disk",
                "error",
                text,
                "lower kv_tier.disk_gib, or free space",
                data=data,
            )
        ]
    return [Finding("kv-tier-disk", "ok", text, data=data)]


def _not_a_folder(folder: Path) -> tuple[str, str] | None:
    """What `folder` is when it is not a folder the tier can use (message, fix), or None."""
    shown = str(folder) if len(str(folder)) <= 120 else f"{str(folder)[:100]}..."
    try:
        mode = folder.stat().st_mode
    except FileNotFoundError:
        return (
            f"the KV tier's disk folder {shown} does not exist",
            f"mkdir -p {shown}, on a local NVMe disk",
        )
    except OSError as exc:
        return (
            f"the KV tier's disk folder {shown} cannot be used: {exc.strerror or exc}",
            "set kv_tier.disk_path to a folder on a local NVMe disk",
        )
    if stat.S_ISDIR(mode):
        return None
    kind = (
        "a regular file"
        if stat.S_ISREG(mode)
        else "a device"
        if stat.S_ISBLK(mode) or stat.S_ISCHR(mode)
        else "not a folder"
    )
    return (
        f"the KV tier's disk folder {shown} is {kind}, not a folder",
        "set kv_tier.disk_path to a folder on a local NVMe disk (a file system, not a device)",
    )
