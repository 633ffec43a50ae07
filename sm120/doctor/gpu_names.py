"""Compute capability from a GPU's name, for outputs that do not print it (the default
table). Data in sm120/data/gpus.yaml; a shown compute_cap always wins over this guess."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

from sm120.core.yaml_data import load_yaml


@dataclass(frozen=True)
class KnownGpu:
    pattern: re.Pattern[str]
    compute_cap: str
    family: str


@functools.cache
def known_gpus() -> tuple[KnownGpu, ...]:
    text = resources.files("sm120.data").joinpath("gpus.yaml").read_text(encoding="utf-8")
    return tuple(
        KnownGpu(re.compile(item["match"], re.IGNORECASE), str(item["compute_cap"]), item["family"])
        for item in load_yaml(text)
    )


def lookup(name: str | None) -> KnownGpu | None:
    if not name:
        return None
    for gpu in known_gpus():
        if gpu.pattern.search(name):
            return gpu
    return None


def arch_of(compute_cap: str | None) -> str | None:
    """'12.0' -> 'sm_120'; None for anything that is not major.minor."""
    if not compute_cap:
        return None
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", compute_cap)
    return f"sm_{int(match.group(1))}{int(match.group(2))}" if match else None


def gpu_arch(name: str | None, compute_cap: str | None) -> tuple[str | None, str]:
    """(arch, how it is known): 'shown' when the output printed it, 'name' when guessed."""
    shown = arch_of(compute_cap)
    if shown:
        return shown, "shown"
    known = lookup(name)
    if known:
        return arch_of(known.compute_cap), "name"
    return None, "unknown"


def edition(name: str | None, power_limit_w: float | None) -> str | None:
    """RTX PRO 6000 editions: the full name says it; a cut name only through the power cap
    (300 W is the Max-Q card, 600 W the Workstation or Server card)."""
    if not name or "RTX PRO 6000" not in name:
        return None
    for word in ("Max-Q", "Server Edition", "Workstation Edition"):
        if word in name:
            return word.replace(" Edition", "")
    if power_limit_w is not None:
        cap = f"{power_limit_w:g} W"
        if power_limit_w <= 325:
            return f"Max-Q (from its {cap} power cap)"
        return f"Workstation or Server (from its {cap} power cap)"
    return None
