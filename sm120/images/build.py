"""`sm120 build`: build a recipe's image (or reuse one whose labels already match)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error
from sm120.engine import docker_api
from sm120.images.context import build_context, source_root
from sm120.images.facts import ENGINE_LOCK, TOOLKIT_DIR, load_facts, toolkit_lock_name
from sm120.images.manifest import (
    BUILD_HASH_LABEL,
    MANIFEST_FILE,
    RECIPE_LABEL,
    base_build_args,
    build_hash,
    make_manifest,
    manifest_labels,
    patch_entries,
)
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.schema import build_arg_problem

Progress = Callable[[str], None]


class BuildRefused(SM120Error):
    """The plan's image is not one sm120 builds."""


@dataclass(frozen=True)
class BuildOptions:
    no_cache: bool = False
    # Extra wheels put in the context (e.g. a CPU torch build that no index here serves).
    wheels: Sequence[Path] = ()
    # Docker build network: "host" where the engine has no bridge network.
    network: str | None = None
    # Extra build arguments on top of the recipe's (e.g. TORCH_INDEX_URL=).
    build_args: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The recipe's own build_args are checked by its schema; these are held to the same.
        for key, value in self.build_args.items():
            problem = build_arg_problem(key, value)
            if problem:
                raise SM120Error(f"--build-arg {problem}", BUILD_ARG_HINT)


BUILD_ARG_HINT = "e.g. --build-arg TORCH_INDEX_URL="


@dataclass(frozen=True)
class BuildPlan:
    """Everything a build would do; what `sm120 build --dry-run` prints."""

    tag: str
    build_hash: str
    dockerfile: str
    base: str
    build_args: dict[str, str]
    files: tuple[str, ...]
    context_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "build_hash": self.build_hash,
            "dockerfile": self.dockerfile,
            "base": self.base,
            "build_args": self.build_args,
            "context_files": len(self.files),
            "context_bytes": self.context_bytes,
            "labels": [RECIPE_LABEL, BUILD_HASH_LABEL, "sm120.manifest"],
        }


@dataclass(frozen=True)
class BuildResult:
    tag: str
    image_id: str
    reused: bool


def _context_name(plan: LaunchPlan) -> str:
    if plan.image.build != "dockerfile" or not plan.image.context:
        raise BuildRefused(
            f"{plan.recipe} runs the published image {plan.image_ref}; there is nothing to build",
            f"pull it instead: docker pull {plan.image_ref}",
        )
    return plan.image.context


def plan_build(plan: LaunchPlan, options: BuildOptions) -> tuple[BuildPlan, bytes]:
    context = build_context(_context_name(plan), options.wheels)
    args = {**base_build_args(plan), **options.build_args}
    # Overrides change the image, except those that only say where packages come from.
    content_args = {k: v for k, v in options.build_args.items() if not k.endswith("_INDEX_URL")}
    described = BuildPlan(
        tag=plan.image_ref,
        build_hash=build_hash(plan, context.digest, content_args),
        dockerfile=context.dockerfile,
        base=plan.base_image_ref,
        build_args=args,
        files=context.files,
        context_bytes=len(context.tar),
    )
    return described, context.tar


def find_built(client: Any, plan: LaunchPlan, wanted_hash: str) -> Any | None:
    matches = docker_api.images_labelled(
        client, {RECIPE_LABEL: plan.recipe, BUILD_HASH_LABEL: wanted_hash}
    )
    return matches[0] if matches else None


def _base_digest(client: Any, base: str, progress: Progress) -> str | None:
    image = docker_api.get_image(client, base)
    if image is None:
        progress(f"pulling the base image {base}")
        try:
            image = client.images.pull(base)
        except Exception as exc:
            raise docker_api.DockerFailure(
                f"cannot pull the base image {base}: {docker_api._first_line(exc)}",
                "check the registry is reachable, or load the image with 'docker load'",
            ) from exc
    repo_digests = image.attrs.get("RepoDigests") or []
    if repo_digests:
        return str(repo_digests[0]).split("@", 1)[1]
    # A locally made or loaded image has no registry digest: its content id still pins it.
    return str(image.id)


def require_locks(plan: LaunchPlan) -> None:
    """A build installs from committed locks only: refuse before Docker starts without them."""
    root = source_root()
    facts = load_facts(root / "images" / _context_name(plan))
    wanted = (
        root / "images" / _context_name(plan) / ENGINE_LOCK,
        root / TOOLKIT_DIR / toolkit_lock_name(facts.python),
    )
    for path in wanted:
        if not path.is_file():
            raise BuildRefused(
                f"{path.relative_to(root)} is missing",
                f"make the locks first: sm120 build {plan.recipe} --lock (needs the network)",
            )


def build(client: Any, plan: LaunchPlan, options: BuildOptions, progress: Progress) -> BuildResult:
    described, _ = plan_build(plan, options)
    require_locks(plan)
    if not options.no_cache:
        existing = find_built(client, plan, described.build_hash)
        if existing is not None:
            existing.tag(described.tag)
            progress(f"reusing {existing.short_id}: its labels match build {described.build_hash}")
            return BuildResult(described.tag, str(existing.id), reused=True)
    digest = _base_digest(client, described.base, progress)
    manifest = make_manifest(
        plan,
        tag=described.tag,
        build_id=described.build_hash,
        base_digest=digest,
        patches=patch_entries(source_root() / "images" / _context_name(plan)),
    )
    # The manifest file travels in the payload (one COPY), not as a build step of its own.
    context = build_context(
        _context_name(plan),
        options.wheels,
        generated={MANIFEST_FILE: (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()},
    )
    image_id = docker_api.build_image(
        context.tar,
        dockerfile=described.dockerfile,
        tag=described.tag,
        buildargs=described.build_args,
        labels=manifest_labels(manifest),
        network_mode=options.network,
        no_cache=options.no_cache,
        progress=progress,
    )
    return BuildResult(described.tag, image_id, reused=False)


def build_locally(plan: LaunchPlan, options: BuildOptions, progress: Progress) -> BuildResult:
    """`build` with this machine's Docker engine; a missing lock is refused before Docker is
    asked, since it is the first thing to fix."""
    require_locks(plan)
    return build(docker_api.connect(), plan, options, progress)
