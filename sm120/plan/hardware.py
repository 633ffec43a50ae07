"""The hardware a plan is checked against: detected, declared on the command line, or
assumed from the recipe when nothing is known (a dry run on a laptop).

This is the model only: detection runs nvidia-smi, so it lives in sm120.doctor.detect and the
caller hands its answer in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sm120.core.errors import PlanError
from sm120.core.suggest import did_you_mean
from sm120.recipe.schema import HardwareSpec

KNOWN_ARCHS = ("sm_120", "sm_121", "sm_100", "sm_90", "sm_89", "sm_80", "cpu")


@dataclass(frozen=True)
class Hardware:
    gpus: int
    arch: str  # the compute capability every GPU shares, or "cpu"
    source: Literal["detected", "declared", "assumed"]
    names: tuple[str, ...] = ()

    def describe(self) -> str:
        what = "CPU only" if self.gpus == 0 else f"{self.gpus}x {self.arch}"
        return f"{what} ({self.source})"

    @property
    def is_sm12x(self) -> bool:
        return self.arch in ("sm_120", "sm_121")


def arch_from_compute_cap(cap: str) -> str:
    major, _, minor = cap.strip().partition(".")
    return f"sm_{int(major)}{int(minor or 0)}"


def declared(gpus: int | None, arch: str | None) -> Hardware | None:
    if gpus is None and arch is None:
        return None
    if arch is not None and arch not in KNOWN_ARCHS:
        raise PlanError(
            f"unknown --arch '{arch}'{did_you_mean(arch, KNOWN_ARCHS)}",
            f"use one of {', '.join(KNOWN_ARCHS)}",
        )
    if gpus is not None and gpus < 0:
        raise PlanError(f"--gpus must be 0 or more, got {gpus}", "e.g. --gpus 4")
    count = gpus if gpus is not None else (0 if arch == "cpu" else 1)
    return Hardware(gpus=count, arch=arch or ("cpu" if count == 0 else "sm_120"), source="declared")


def assumed(spec: HardwareSpec) -> Hardware:
    return Hardware(gpus=spec.gpus, arch=spec.compute_caps[0], source="assumed")


def divisors(number: int) -> list[int]:
    """The sizes that split `number` evenly (TP 9: 1, 3, 9; TP 4: 1, 2, 4): the DCPs a TP
    takes, the TPs a head count takes. GPU counts need not be powers of two."""
    return [size for size in range(1, number + 1) if number % size == 0]


def spelled(sizes: list[int]) -> str:
    """'1, 3 or 9' for a hint."""
    words = [str(size) for size in sizes]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
