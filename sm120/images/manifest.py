"""What an image says about itself: a manifest kept both as labels and as a file inside.

Labels answer "what is this image" without starting it; the file answers the same question
from inside a running container (`sm120 info` on a live deployment), which is where patch
provenance matters when a bug report comes in.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sm120 import __version__
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.patches import manifest, read_stack

MANIFEST_PATH = "/opt/sm120/manifest.json"
# Where the manifest sits in the build context's payload folder (copied to /opt/sm120/).
MANIFEST_FILE = "manifest.json"
MANIFEST_LABEL = "sm120.manifest"
BUILD_HASH_LABEL = "sm120.build-hash"
RECIPE_LABEL = "sm120.recipe"
MANIFEST_SCHEMA = 2


def base_build_args(plan: LaunchPlan) -> dict[str, str]:
    return {"BASE_IMAGE": plan.base_image_ref, **plan.image.build_args}


def build_hash(
    plan: LaunchPlan, context_digest: str, extra_args: dict[str, str] | None = None
) -> str:
    """Identity of what goes into the image: image spec and context, not the serve flags,
    so a new port or context length reuses the image instead of rebuilding it."""
    identity = {
        "engine": plan.engine,
        "image": plan.image.identity(),
        "context": context_digest,
        "extra_args": extra_args or {},
    }
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def patch_entries(context_dir: Path) -> list[dict[str, Any]]:
    """The patches an image context applies, with what they fix (read from their headers)."""

    return manifest(read_stack(context_dir))


def make_manifest(
    plan: LaunchPlan,
    *,
    tag: str,
    build_id: str,
    base_digest: str | None,
    patches: list[dict[str, Any]],
    built_at: datetime | None = None,
) -> dict[str, Any]:
    when = built_at or datetime.now(timezone.utc)
    return {
        "schema": MANIFEST_SCHEMA,
        "recipe": plan.recipe,
        "variants": list(plan.variants),
        "build_hash": build_id,
        # What the entrypoint compares a .env's plan against: the tag it would need.
        "tag": tag,
        "base": {"ref": plan.base_image_ref, "digest": base_digest},
        "engine": {
            "name": plan.engine,
            "flavour": plan.image.flavour,
            "ref": plan.image.engine_version,
            "commit": plan.image.engine_commit,
            "build_args": dict(plan.image.build_args),
        },
        "patches": patches,
        "sm120_version": __version__,
        "built_at": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def manifest_labels(manifest: dict[str, Any]) -> dict[str, str]:
    """Docker labels: the two sm120 looks images up by, and the whole manifest. Few on purpose:
    the classic builder adds one build step per label, and on vfs storage each step copies the
    image's whole filesystem."""
    labels = {
        RECIPE_LABEL: manifest["recipe"],
        BUILD_HASH_LABEL: manifest["build_hash"],
        MANIFEST_LABEL: json.dumps(manifest, sort_keys=True, separators=(",", ":")),
    }
    return labels


def manifest_from_labels(labels: dict[str, str] | None) -> dict[str, Any] | None:
    text = (labels or {}).get(MANIFEST_LABEL)
    if not text:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
