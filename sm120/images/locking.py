"""`sm120 build NAME --lock`: make an image's lock files, and resolve them again to find
conflicts. The one place that runs uv (and git, for an engine ref's requirement files).

  toolkit   images/toolkit/pyX.Y.lock   `uv pip compile pyproject.toml` for the image's Python
  engine    images/<context>/engine.lock, made as image.yaml's `lock_from` says:
            resolve  `uv pip compile` of its requirements for the image's Python and platform
            ref      the same, from the requirement files at the engine ref (git, network)
            capture  the installed environment of the pinned base (Docker, registry)

Every lock starts with the command that made it, so nobody edits one by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sm120.core.errors import SM120Error
from sm120.engine import docker_api
from sm120.images.context import source_root
from sm120.images.facts import (
    ENGINE_LOCK,
    TOOLKIT_DIR,
    ImageFacts,
    load_facts,
    toolkit_lock_name,
)
from sm120.images.lockfile import INVENTORY_SCRIPT, parse_lock
from sm120.plan.resolve import LaunchPlan

Progress = Callable[[str], None]
# Where the toolkit's lock is resolved for; every Linux x86_64 image here is at least this.
TOOLKIT_PLATFORM = "x86_64-manylinux_2_28"


class LockError(SM120Error):
    """A lock cannot be made or does not resolve."""


@dataclass(frozen=True)
class LockTarget:
    """One lock file and the uv command line that makes it (for resolve / ref / toolkit)."""

    path: Path
    header: str
    argv: tuple[str, ...]


def uv_binary() -> str:
    found = shutil.which("uv")
    if found is None:
        raise LockError("making locks needs uv", "pip install uv (it comes with the dev extra)")
    return found


def header(recipe: str, how: str) -> str:
    return (
        f"# Made by `sm120 build {recipe} --lock` ({how}); see images/README.md.\n"
        "# Do not edit: run the command again.\n"
    )


def _compile_argv(source: str, python: str, platform: str, *, hashes: bool = True) -> list[str]:
    argv = [uv_binary(), "pip", "compile", source, "--python-version", python]
    argv += ["--python-platform", platform, "--no-header", "--quiet"]
    return [*argv, "--generate-hashes"] if hashes else argv


def toolkit_target(root: Path, recipe: str, python: str) -> LockTarget:
    path = root / TOOLKIT_DIR / toolkit_lock_name(python)
    argv = _compile_argv(str(root / "pyproject.toml"), python, TOOLKIT_PLATFORM)
    return LockTarget(path, header(recipe, f"toolkit, Python {python}"), tuple(argv))


def engine_source_argv(facts: ImageFacts, source: str) -> list[str]:
    engine = facts.engine
    argv = _compile_argv(source, facts.python, facts.platform)
    if engine.extra_index_url and "UV_EXTRA_INDEX_URL" not in os.environ:
        # UV_EXTRA_INDEX_URL overrides it (a mirror of the index, or a wheel folder's stand-in).
        argv += ["--extra-index-url", engine.extra_index_url]
    if engine.extra_index_url or "UV_EXTRA_INDEX_URL" in os.environ:
        argv += ["--index-strategy", "unsafe-best-match"]
    if engine.exclude_newer:
        argv += ["--exclude-newer", engine.exclude_newer]
    for name in sorted(engine.removed):
        argv += ["--no-emit-package", name]
    return argv


def _run_uv(argv: list[str], stdin: str | None = None) -> str:
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        raise LockError(
            "uv could not resolve: " + " ".join(line.strip() for line in lines[-3:]),
            "check the requirements and the network (uv reaches the package index)",
        )
    return result.stdout


def write_lock(target: LockTarget, stdin: str | None = None) -> Path:
    body = _run_uv(list(target.argv), stdin)
    target.path.parent.mkdir(parents=True, exist_ok=True)
    target.path.write_text(target.header + body, encoding="utf-8")
    return target.path


def lock_resolved(facts: ImageFacts, context_dir: Path, recipe: str) -> Path:
    argv = engine_source_argv(facts, "-")
    target = LockTarget(context_dir / ENGINE_LOCK, header(recipe, "engine, resolved"), tuple(argv))
    return write_lock(target, "\n".join(facts.engine.requirements) + "\n")


def lock_from_ref(
    facts: ImageFacts, context_dir: Path, recipe: str, repo: str, ref: str, progress: Progress
) -> Path:
    """The engine's dependencies as its ref declares them (requirements/cuda.txt, which
    includes common.txt), read from a shallow clone of the ref."""
    with tempfile.TemporaryDirectory(prefix="sm120-ref-") as tmp:
        progress(f"cloning {repo} at {ref}")
        cloned = subprocess.run(
            ["git", "clone", "--quiet", "--depth", "1", "--branch", ref, repo, tmp],
            capture_output=True, text=True, check=False, timeout=1800,
        )  # fmt: skip
        if cloned.returncode != 0:
            raise LockError(
                f"cannot clone {repo} at {ref}: {cloned.stderr.strip().splitlines()[-1:]}",
                "locking from the engine ref needs git and the network",
            )
        requirements = Path(tmp) / "requirements" / "cuda.txt"
        if not requirements.is_file():
            raise LockError(
                f"{ref} has no requirements/cuda.txt", "read the ref's requirement files"
            )
        argv = engine_source_argv(facts, str(requirements))
        target = LockTarget(
            context_dir / ENGINE_LOCK, header(recipe, f"engine, from {ref}"), tuple(argv)
        )
        return write_lock(target)


def captured_lock_text(recipe: str, base: str, inventory: dict[str, str]) -> str:
    lines = [f"{name}=={version}" for name, version in sorted(inventory.items())]
    return (
        header(recipe, f"engine, captured from {base}")
        + "# Captured from the installed environment: versions exact, no hashes (the engine "
        "is the base's own, never installed from this file).\n" + "\n".join(lines) + "\n"
    )


def resolve_conflicts(
    lock_path: Path,
    python: str,
    platform: str,
    left_out: frozenset[str] = frozenset(),
    extra_index_url: str | None = None,
) -> list[str]:
    """Resolve a lock again for the image's Python and platform: uv's complaint if its pins
    conflict, and any package the pins need that the lock does not carry (except those the
    image leaves out on purpose)."""
    pinned = parse_lock(lock_path.read_text()).pins
    argv = _compile_argv(str(lock_path), python, platform, hashes=False)
    if extra_index_url and "UV_EXTRA_INDEX_URL" not in os.environ:
        argv += ["--extra-index-url", extra_index_url]
    if extra_index_url or "UV_EXTRA_INDEX_URL" in os.environ:
        argv += ["--index-strategy", "unsafe-best-match"]
    try:
        resolved = parse_lock(_run_uv(argv)).pins
    except LockError as exc:
        return [f"{lock_path.name}: {exc.message}"]
    return [
        f"{lock_path.name}: {name}=={version} is needed but not locked"
        for name, version in sorted(resolved.items())
        if name not in pinned and name not in left_out
    ]


def capture_lock(facts: ImageFacts, context_dir: Path, recipe: str, base: str) -> Path:
    """The base image's own engine environment, read by its interpreter in a container."""
    output = docker_api.run_once(
        docker_api.connect(), base, [facts.engine.python, "-c", INVENTORY_SCRIPT]
    )
    path = context_dir / ENGINE_LOCK
    path.write_text(captured_lock_text(recipe, base, json.loads(output)), encoding="utf-8")
    return path


def make_locks(plan: LaunchPlan, progress: Progress) -> list[Path]:
    """Write the toolkit lock for the image's Python and the image's engine lock."""
    root = source_root()
    context_dir = root / "images" / str(plan.image.context)
    facts = load_facts(context_dir)
    progress(f"locking the toolkit for Python {facts.python}")
    written = [write_lock(toolkit_target(root, plan.recipe, facts.python))]
    progress(f"locking the engine ({facts.engine.lock_from})")
    if facts.engine.lock_from == "resolve":
        written.append(lock_resolved(facts, context_dir, plan.recipe))
    elif facts.engine.lock_from == "ref":
        args = plan.image.build_args
        if "VLLM_REPO" not in args or "VLLM_REF" not in args:
            raise LockError(
                f"{plan.recipe}'s image names no VLLM_REPO / VLLM_REF to lock from",
                "set them in the recipe's image.build_args",
            )
        written.append(
            lock_from_ref(
                facts, context_dir, plan.recipe, args["VLLM_REPO"], args["VLLM_REF"], progress
            )
        )
    else:
        written.append(capture_lock(facts, context_dir, plan.recipe, plan.base_image_ref))
    return written
