"""`sm120 tune`'s answer, kept for this host: the winning settings of a recipe (and its
variants), the fingerprint of what the figure depends on, and the figures themselves.

`sm120 launch` applies a result only where the fingerprint matches to the letter (the GPU
model and count, the PCIe links, the driver, the engine ref and the recipe file); anywhere
else it says why not. The search that writes a result lives in sm120.tune (above this layer);
the launch, `recipes show` and the dashboard read it from here.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.paths import sm120_home
from sm120.doctor.gpu_source import probe_gpus
from sm120.doctor.runner import Runner, run_command
from sm120.engine.gpu_readings import load_nvml
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.loader import recipe_path

RESULT_VERSION = 1
# Fingerprint fields in the order a difference is named.
FINGERPRINT_FIELDS = (
    "gpu_count",
    "gpu_models",
    "pcie_links",
    "topology",
    "driver",
    "engine_ref",
    "recipe_hash",
)


def tuned_dir() -> Path:
    return sm120_home() / "tuned"


def result_key(recipe: str, variants: tuple[str, ...]) -> str:
    """One result per recipe and chosen variants: `tiny`, `tiny+gpu`."""
    return "+".join((recipe, *variants))


def result_path(recipe: str, variants: tuple[str, ...]) -> Path:
    return tuned_dir() / f"{result_key(recipe, variants)}.json"


def recipe_hash(plan: LaunchPlan) -> str:
    """The recipe file as written plus the variants chosen: an edited recipe is another one."""
    digest = hashlib.sha256(recipe_path(plan.recipe).read_bytes())
    digest.update(json.dumps(list(plan.variants)).encode())
    return digest.hexdigest()[:16]


def engine_ref(plan: LaunchPlan) -> str:
    pin = f"@{plan.image.pin}" if plan.image.pin else ""
    return f"{plan.image.engine_version} ({plan.base_image_ref}{pin})"


def host_fingerprint(
    plan: LaunchPlan, run: Runner = run_command, nvml: Any = None
) -> dict[str, Any]:
    """What the figure depends on, read from this machine (NVML or nvidia-smi) and the plan.
    On a machine without GPUs the GPU fields are empty: a CPU result stays a CPU result."""
    probe = probe_gpus(run, nvml if nvml is not None else load_nvml())
    snapshot = probe.snapshot
    gpus = snapshot.gpus if snapshot is not None else []
    topology = snapshot.topology if snapshot is not None else None
    return {
        "gpu_count": len(gpus),
        "gpu_models": [gpu.name or "unknown" for gpu in gpus],
        # The maximum generation and width: an idle GPU drops its current generation.
        "pcie_links": [f"gen{gpu.pcie_gen_max} x{gpu.pcie_width_max}" for gpu in gpus],
        "topology": sorted(f"{pair} {label}" for pair, label in topology.links.items())
        if topology is not None
        else [],
        "driver": snapshot.driver_version if snapshot is not None else None,
        "engine_ref": engine_ref(plan),
        "recipe_hash": recipe_hash(plan),
    }


def fingerprint_differences(saved: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """Each field that differs, as `gpu_count 2 -> 1`."""
    return [
        f"{name} {_shown(saved.get(name))} -> {_shown(here.get(name))}"
        for name in FINGERPRINT_FIELDS
        if saved.get(name) != here.get(name)
    ]


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    return str(value)


def save_result(document: dict[str, Any]) -> Path:
    """Write a result (sm120.tune builds it) atomically, 0600 like the rest of the state."""
    path = result_path(document["recipe"], tuple(document["variants"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.part")
    temporary.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    temporary.chmod(0o600)
    temporary.replace(path)
    return path


def load_result(recipe: str, variants: tuple[str, ...]) -> dict[str, Any] | None:
    path = result_path(recipe, variants)
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("version") != RESULT_VERSION:
        return None
    return document


def all_results() -> list[dict[str, Any]]:
    """Every result kept on this host (the dashboard lists them)."""
    folder = tuned_dir()
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.json")):
        recipe, *variants = path.stem.split("+")
        document = load_result(recipe, tuple(variants))
        if document is not None:
            found.append(document)
    return found


def gain_text(document: dict[str, Any]) -> str:
    """`+12.3% aggregate at 16 against the default`, or why there is no gain."""
    verdict = document.get("verdict") or {}
    what = document.get("objective_label", document.get("objective", "the objective"))
    if not verdict.get("gain"):
        return f"no gain on {what} beyond the noise; the default stands"
    return f"{verdict['change_pct']:+.1f}% {what} against the default"


def provenance_line(document: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d", time.gmtime(document.get("finished_at", 0)))
    sets = " ".join(document.get("winner", {}).get("sets", [])) or "the default"
    return f"tuned here on {when}, {gain_text(document)} ({sets})"


@dataclass(frozen=True)
class TunedLookup:
    """What a launch found: the sets to apply (empty when none), and a line to show."""

    sets: tuple[str, ...]
    line: str | None


NOTHING = TunedLookup((), None)


def tuned_for(
    plan: LaunchPlan,
    fingerprint: Callable[[LaunchPlan], dict[str, Any]] | None = None,
) -> TunedLookup:
    """The result kept for this plan's recipe and variants, if it was measured on this very
    host and beat the default beyond the noise. No file, no cost: the GPUs are only read
    when a result exists."""
    document = load_result(plan.recipe, plan.variants)
    if document is None:
        return NOTHING
    here = (fingerprint or host_fingerprint)(plan)
    differences = fingerprint_differences(document.get("fingerprint", {}), here)
    if differences:
        return TunedLookup(
            (),
            f"tuned settings for {document['key']} not applied: they were measured on another "
            f"host or build ({'; '.join(differences)}); run 'sm120 tune {plan.recipe}' here",
        )
    if not (document.get("verdict") or {}).get("gain"):
        return TunedLookup((), provenance_line(document))
    # A layer under the command line (plan.resolve): an explicit --set still wins.
    return TunedLookup(tuple(document.get("winner", {}).get("sets", [])), provenance_line(document))


def tuned_summary(
    plan: LaunchPlan, fingerprint: Callable[[LaunchPlan], dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """The kept result beside the published figure and the roofline (`recipes show`, the
    dashboard): its figures, its verdict, and whether a launch here would apply it."""
    document = load_result(plan.recipe, plan.variants)
    if document is None:
        return None
    lookup = tuned_for(plan, fingerprint)
    leader, default = document.get("leader") or {}, document.get("default") or {}
    return {
        "key": document["key"],
        "objective": document.get("objective_label"),
        "unit": document.get("unit"),
        "leader": leader.get("value"),
        "default": default.get("value"),
        "verdict": document.get("verdict"),
        "winner": (document.get("winner") or {}).get("sets", []),
        "applies_here": bool(lookup.sets),
        "line": lookup.line,
        "finished_at": document.get("finished_at"),
    }
