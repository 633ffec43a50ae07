"""`sm120 build NAME --write-env`: put the built image (and the recipe it serves) into a .env
file, keeping every other line, comment and order as it was."""

from __future__ import annotations

import re
from pathlib import Path

from sm120.plan.resolve import LaunchPlan


def set_values(path: Path, values: dict[str, str]) -> None:
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    pending = dict(values)
    out = []
    for line in lines:
        match = re.match(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=", line)
        if match and match.group(1) in pending:
            out.append(f"{match.group(1)}={pending.pop(match.group(1))}")
        else:
            out.append(line)
    out += [f"{key}={value}" for key, value in pending.items()]
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def write_image(path: Path, plan: LaunchPlan, tag: str) -> None:
    """What compose.yaml reads from .env to run the built image: IMAGE, RECIPE and VARIANT."""
    set_values(path, {"IMAGE": tag, "RECIPE": plan.recipe, "VARIANT": ",".join(plan.variants)})
