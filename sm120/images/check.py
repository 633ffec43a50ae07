"""`sm120 build NAME --check`: does the image of NAME hold what the images promise? Offline
from the committed files (locks, image.yaml, Dockerfile, recipe); `resolve=True` also
resolves both locks again with uv (needs the package index)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sm120.images.facts import (
    ENGINE_LOCK,
    TOOLKIT_DIR,
    TOOLKIT_PYTHON,
    ImageFacts,
    load_facts,
    toolkit_lock_name,
)
from sm120.images.lockfile import canonical, parse_lock
from sm120.images.locking import TOOLKIT_PLATFORM, resolve_conflicts
from sm120.plan.resolve import LaunchPlan

INSTALL_TOOLKIT = "/opt/sm120/images/toolkit/install-toolkit.sh"
_FROM = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)", re.M)
_ARG_DEFAULT = re.compile(r"^ARG\s+(\w+)=(\S+)", re.M)


# What making each kind of engine lock needs (none of it is here offline).
LOCK_NEEDS = {
    "resolve": "resolved by uv: needs the package index",
    "capture": "captured from the pinned base: needs Docker and its registry",
    "ref": "from the engine ref's requirement files: needs git and the network",
}


@dataclass
class ImageCheck:
    recipe: str
    tag: str
    python: str
    engine_lock: str | None
    toolkit_lock: str | None
    engine: dict[str, str]
    toolkit_isolated: bool
    base_digest_pinned: bool
    conflicts: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(
            self.engine_lock
            and self.toolkit_lock
            and self.toolkit_isolated
            and self.base_digest_pinned
            and not self.conflicts
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def toolkit_isolated(dockerfile: str) -> bool:
    """The toolkit goes into its venv through the shared script, the entrypoint runs with
    the venv's Python, and nothing installs sm120's payload into the engine's environment."""
    installs_payload = re.search(r"pip[0-9.]* install[^\n]*(/opt/sm120|sm120-payload)", dockerfile)
    return (
        INSTALL_TOOLKIT in dockerfile
        and f'ENTRYPOINT ["{TOOLKIT_PYTHON}"' in dockerfile
        and installs_payload is None
    )


def base_digest_pinned(plan: LaunchPlan, dockerfile: str) -> bool:
    """Every FROM names an earlier stage or a `tag@sha256:` reference, and the recipe pins
    the digest the build passes as BASE_IMAGE."""
    if not plan.image.digest:
        return False
    defaults = dict(_ARG_DEFAULT.findall(dockerfile))
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", dockerfile, re.M | re.I))
    for ref in _FROM.findall(dockerfile):
        if ref in stages:
            continue
        variable = re.fullmatch(r"\$\{?(\w+)\}?", ref)
        value = defaults.get(variable.group(1), "") if variable else ref
        if "@sha256:" not in value:
            return False
    return True


def _lock_conflicts(facts: ImageFacts, text: str, where: str, captured: bool) -> list[str]:
    lock = parse_lock(text)
    found = [f"{where}: '{line}' is not pinned with ==" for line in lock.unpinned]
    if not captured:
        found += [f"{where}: {name} has no hash" for name in lock.unhashed]
    for name in facts.engine.removed if where.endswith(ENGINE_LOCK) else ():
        if canonical(name) in lock.pins:
            found.append(f"{where}: {name} is locked, but the image leaves it out")
    return found


def check_image(root: Path, plan: LaunchPlan, *, resolve: bool = False) -> ImageCheck:
    context = str(plan.image.context)
    context_dir = root / "images" / context
    facts = load_facts(context_dir)
    dockerfile = (context_dir / "Dockerfile").read_text(encoding="utf-8")
    engine_path = context_dir / ENGINE_LOCK
    toolkit_path = root / TOOLKIT_DIR / toolkit_lock_name(facts.python)
    conflicts: list[str] = []
    engine: dict[str, str] = {}
    rel = {path: str(path.relative_to(root)) for path in (engine_path, toolkit_path)}
    captured = facts.engine.lock_from == "capture"
    if engine_path.is_file():
        text = engine_path.read_text(encoding="utf-8")
        pins = parse_lock(text).pins
        engine = {name: pins.get(canonical(name), "not locked") for name in facts.engine.packages}
        conflicts += _lock_conflicts(facts, text, rel[engine_path], captured)
    else:
        conflicts.append(
            f"{rel[engine_path]} is missing: make it with 'sm120 build {plan.recipe} --lock' "
            f"({LOCK_NEEDS[facts.engine.lock_from]})"
        )
    if toolkit_path.is_file():
        conflicts += _lock_conflicts(facts, toolkit_path.read_text(), rel[toolkit_path], False)
    else:
        conflicts.append(f"{rel[toolkit_path]} is missing: 'sm120 build {plan.recipe} --lock'")
    if resolve:
        left_out = frozenset(canonical(name) for name in facts.engine.removed)
        if engine_path.is_file() and not captured:
            conflicts += resolve_conflicts(
                engine_path,
                facts.python,
                facts.platform,
                left_out,
                facts.engine.extra_index_url,
            )
        if toolkit_path.is_file():
            conflicts += resolve_conflicts(toolkit_path, facts.python, TOOLKIT_PLATFORM)
    return ImageCheck(
        recipe=plan.recipe,
        tag=plan.image_ref,
        python=facts.python,
        engine_lock=rel[engine_path] if engine_path.is_file() else None,
        toolkit_lock=rel[toolkit_path] if toolkit_path.is_file() else None,
        engine=engine,
        toolkit_isolated=toolkit_isolated(dockerfile),
        base_digest_pinned=base_digest_pinned(plan, dockerfile),
        conflicts=conflicts,
    )
