"""`sm120 info`: the manifest of a built image or of a running container.

From a container the manifest is read from the file inside it, so the answer is what is
actually running (patch provenance at run time), not what the tag claims today.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sm120.core.errors import SM120Error
from sm120.engine import docker_api
from sm120.engine.find import find_deployment
from sm120.engine.state import is_deployment_name, load_state
from sm120.images.manifest import MANIFEST_PATH, RECIPE_LABEL, manifest_from_labels


class NoManifest(SM120Error):
    """Nothing with an sm120 manifest matches."""


@dataclass(frozen=True)
class ImageInfo:
    source: str
    manifest: dict[str, Any]

    def describe(self) -> list[str]:
        m = self.manifest
        engine = m.get("engine", {})
        base = m.get("base", {})
        lines = [
            f"{self.source}",
            f"  recipe    {m.get('recipe')}  (build {m.get('build_hash')})",
            f"  built     {m.get('built_at')}",
            f"  base      {base.get('ref')}  digest {base.get('digest') or 'unknown'}",
            f"  engine    {engine.get('name')} {engine.get('ref')}"
            + (f" @ {engine['commit']}" if engine.get("commit") else ""),
        ]
        patches = m.get("patches") or []
        if not patches:
            lines.append("  patches   none")
        for patch in patches:
            ids = ", ".join(patch.get("failure_ids", [])) or "-"
            lines.append(f"  patch     {patch.get('name')}  [{ids}]  {patch.get('subject', '')}")
        lines.append(f"  sm120     {m.get('sm120_version')}")
        return lines


def _from_container(container: Any) -> ImageInfo | None:
    raw = docker_api.read_file_from_container(container, MANIFEST_PATH)
    source = f"container {container.name} ({container.short_id}, {container.status})"
    if raw:
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict) and data:
            return ImageInfo(source + ", manifest file inside", data)
    labels = container.image.labels if container.image is not None else {}
    manifest = manifest_from_labels(labels)
    return ImageInfo(source + ", image labels", manifest) if manifest else None


def _from_image(image: Any, what: str) -> ImageInfo | None:
    manifest = manifest_from_labels(image.labels)
    return ImageInfo(f"image {what} ({image.short_id})", manifest) if manifest else None


def _deployment_container(client: Any, name: str | None) -> Any | None:
    if name is not None and not is_deployment_name(name):
        return None  # an image reference (repo:tag, sha256:...) or a container
    state = find_deployment(None) if name is None else load_state(name)
    if state is None:
        return None
    if state.runtime != "docker" or not state.container_id:
        raise NoManifest(
            f"deployment {state.name} runs natively: it has no image",
            "launch it with --runtime docker, or name a recipe or image",
        )
    return docker_api.get_container(client, state.container_id)


def read_info(target: str | None) -> ImageInfo:
    client = docker_api.connect()
    container = _deployment_container(client, target)
    if container is None and target is not None:
        container = docker_api.get_container(client, target)
    if container is not None:
        found = _from_container(container)
        if found:
            return found
    if target is not None:
        by_recipe = docker_api.images_labelled(client, {RECIPE_LABEL: target})
        if by_recipe:
            newest = max(by_recipe, key=lambda image: image.attrs.get("Created", ""))
            found = _from_image(newest, f"of recipe {target}")
            if found:
                return found
        image = docker_api.get_image(client, target)
        if image is not None and (found := _from_image(image, target)):
            return found
    raise NoManifest(
        f"no sm120 image or container matches '{target or 'the running deployment'}'",
        "build one with 'sm120 build RECIPE' or name a deployment, recipe, image or container",
    )
