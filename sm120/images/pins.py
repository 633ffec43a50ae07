"""`sm120 build NAME --refresh-pins`: read each base image's current digest from its registry
(HTTP API v2, a manifest HEAD) and write `tag@sha256:...` into the recipe and the Dockerfile.

It and `sm120 recipes updates` (sm120.images.updates) need the registry; tests point both at
a loopback stand-in through SM120_REGISTRY_MIRROR (a registry answering for every repository,
as a pull-through mirror does).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import httpx

from sm120.core.errors import SM120Error
from sm120.images.context import source_root
from sm120.recipe.loader import load_recipe

DOCKER_HUB = "registry-1.docker.io"
MIRROR_ENV = "SM120_REGISTRY_MIRROR"
# A multi-arch tag answers with an index; its digest is what `docker pull tag@digest` takes.
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class PinError(SM120Error):
    """A base image's digest cannot be read or written."""


@dataclass(frozen=True)
class ImageName:
    registry: str
    repository: str
    tag: str

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


def parse_name(name: str, tag: str) -> ImageName:
    """Docker's naming: a first part with a dot or port is a registry, else Docker Hub, where
    one-part names live under library/."""
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return ImageName(first, rest, tag)
    return ImageName(DOCKER_HUB, name if rest else f"library/{name}", tag)


def registry_url(image: ImageName) -> str:
    """The registry's base URL, or the stand-in SM120_REGISTRY_MIRROR names."""
    mirror = os.environ.get(MIRROR_ENV)
    if mirror:
        return mirror.rstrip("/")
    return f"https://{image.registry}"


def bearer_token(client: httpx.Client, challenge: str, repository: str) -> str:
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if "realm" not in fields:
        raise PinError(f"the registry asked for an unknown login: {challenge}", "")
    params = {"service": fields.get("service", ""), "scope": f"repository:{repository}:pull"}
    reply = client.get(fields["realm"], params=params)
    reply.raise_for_status()
    body = reply.json()
    return str(body.get("token") or body.get("access_token") or "")


def fetch_digest(client: httpx.Client, image: ImageName) -> str:
    url = f"{registry_url(image)}/v2/{image.repository}/manifests/{image.tag}"
    headers = {"Accept": MANIFEST_TYPES}
    try:
        reply = client.head(url, headers=headers)
        challenge = reply.headers.get("www-authenticate", "")
        if reply.status_code == 401 and challenge.lower().startswith("bearer"):
            token = bearer_token(client, challenge, image.repository)
            reply = client.head(url, headers={**headers, "Authorization": f"Bearer {token}"})
    except httpx.HTTPError as exc:
        raise PinError(
            f"cannot reach the registry for {image.ref}: {exc}",
            "refreshing pins needs the network (or SM120_REGISTRY_MIRROR)",
        ) from exc
    digest = str(reply.headers.get("docker-content-digest", ""))
    if reply.status_code != 200 or not _DIGEST.match(digest):
        raise PinError(
            f"the registry has no digest for {image.ref} (HTTP {reply.status_code})",
            "check the recipe's image name and tag",
        )
    return digest


def pin_recipe_text(text: str, name: str, tag: str, digest: str) -> str:
    """Set `digest:` under every `name: NAME` / `tag: TAG` pair of a recipe, keeping the
    file's comments and layout."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        out.append(line)
        match = re.match(r"^(\s*)tag:\s*(\S+)\s*$", line)
        previous = out[-2] if len(out) > 1 else ""
        if (
            match
            and match.group(2).strip("'\"") == tag
            and re.match(rf"^{match.group(1)}name:\s*{re.escape(name)}\s*$", previous)
        ):
            following = lines[index + 1] if index + 1 < len(lines) else ""
            if re.match(rf"^{match.group(1)}digest:", following):
                index += 1  # replaced below
            out.append(f'{match.group(1)}digest: "{digest}"\n')
        index += 1
    return "".join(out)


def pin_dockerfile_text(text: str, ref: str, digest: str) -> str:
    """`ARG BASE_IMAGE=name:tag[@old]` -> `ARG BASE_IMAGE=name:tag@digest`."""
    pattern = re.compile(rf"^ARG BASE_IMAGE={re.escape(ref)}(@sha256:[0-9a-f]+)?$", re.M)
    return pattern.sub(f"ARG BASE_IMAGE={ref}@{digest}", text)


@dataclass(frozen=True)
class Pinned:
    ref: str
    digest: str
    files: tuple[str, ...]


def refresh_pins(
    root: Path, recipe: str, bases: list[tuple[str, str, str]], client: httpx.Client
) -> list[Pinned]:
    """bases: (name, tag, context) of each image the recipe builds. Writes the recipe file
    and each context's Dockerfile; returns what was pinned."""
    recipe_path = root / "recipes" / f"{recipe}.yaml"
    done: list[Pinned] = []
    for name, tag, context in bases:
        digest = fetch_digest(client, parse_name(name, tag))
        files = []
        text = recipe_path.read_text(encoding="utf-8")
        pinned = pin_recipe_text(text, name, tag, digest)
        if pinned != text:
            recipe_path.write_text(pinned, encoding="utf-8")
        files.append(str(recipe_path.relative_to(root)))
        dockerfile = root / "images" / context / "Dockerfile"
        text = dockerfile.read_text(encoding="utf-8")
        dockerfile.write_text(pin_dockerfile_text(text, f"{name}:{tag}", digest), encoding="utf-8")
        files.append(str(dockerfile.relative_to(root)))
        done.append(Pinned(f"{name}:{tag}", digest, tuple(files)))
    return done


def refresh_recipe_pins(recipe: str) -> list[Pinned]:
    """Pin every base image the recipe builds, its variants' included, in this checkout."""
    loaded = load_recipe(recipe)
    specs = [loaded.image, *(v.image for v in loaded.variants.values() if v.image is not None)]
    bases = sorted(
        {(s.name, s.tag, s.context) for s in specs if s.build == "dockerfile" and s.context}
    )
    with httpx.Client(timeout=30, follow_redirects=True) as client:
        return refresh_pins(source_root(), recipe, bases, client)
