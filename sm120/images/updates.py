"""`sm120 recipes updates`: newer engine builds than the ones the recipes pin.

Where an engine's newer builds appear follows from how its image gets the engine:
  - a published image (build 'pull'), or a Dockerfile whose engine is the base image's own
    (image.yaml engine.source 'base'): newer tags of that image's repository, read from the
    registry's HTTP API v2 (`/v2/<repository>/tags/list`, following its Link pages);
  - an engine installed from a lock (engine.source 'lock'): newer releases of its wheel on
    PyPI (`/pypi/<package>/json`);
  - an engine compiled from a git ref (engine.source 'build'): not watched; the line names
    the ref to compare by hand.

Tags are ordered only when they can be: version tags (v0.15.1) by version, and dated tags
(name-...-YYYYMMDD) by date within the same leading name. The recipe's pin is compared too:
an image pinned by digest whose tag now names another digest was rebuilt under the same tag
('moved'); an engine pinned by commit names that commit for the comparison by hand.
Tests point both lookups at a loopback stand-in through SM120_REGISTRY_MIRROR and
SM120_PYPI_URL.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from packaging.version import InvalidVersion, Version

from sm120.core.errors import SM120Error
from sm120.images.context import source_root
from sm120.images.facts import load_facts
from sm120.images.pins import (
    ImageName,
    PinError,
    bearer_token,
    fetch_digest,
    parse_name,
    registry_url,
)
from sm120.recipe.schema import ImageSpec, Recipe

PYPI_ENV = "SM120_PYPI_URL"
PYPI_URL = "https://pypi.org"
# Registries page the tag list in lexical order; vllm/vllm-openai alone carries thousands of
# nightly-<commit> tags before its v* releases. 20 pages of 1,000 reach them; a list cut
# short says so rather than claiming nothing newer exists.
TAG_PAGE = 1000
MAX_TAG_PAGES = 20
SHOWN = 5  # newest builds a line names; the count says how many more there are
# A dated build may carry a rebuild number after its date (kimi-k3-...-20260922-r1).
_DATED = re.compile(
    r"^(?P<name>[A-Za-z]+(?:-[A-Za-z]+)?)-.*-(?P<date>20\d{6})(?:-r(?P<rebuild>\d+))?$"
)

Status = Literal[
    "newer", "current", "incomplete", "unordered", "moved", "unreachable", "not-watched"
]


@dataclass(frozen=True)
class Watched:
    """One engine build a recipe pins, and where newer ones would appear."""

    recipe: str
    variants: tuple[str, ...]
    source: Literal["image", "pypi", "git"]
    name: str  # repository, PyPI project or git repository
    pinned: str  # tag, version or ref
    pin: str | None = None  # the immutable pin: the image's digest or the engine commit

    @property
    def label(self) -> str:
        return f"{self.name}{'==' if self.source == 'pypi' else ':'}{self.pinned}"


@dataclass(frozen=True)
class Update:
    watched: Watched
    status: Status
    newer: tuple[str, ...] = ()  # newest first
    detail: str = ""
    checked: bool = field(init=False)

    def __post_init__(self) -> None:
        checked = ("newer", "current", "incomplete", "unordered", "moved")
        object.__setattr__(self, "checked", self.status in checked)

    def as_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.watched.recipe,
            "variants": list(self.watched.variants),
            "source": self.watched.source,
            "name": self.watched.name,
            "pinned": self.watched.pinned,
            "pin": self.watched.pin,
            "status": self.status,
            "newer": list(self.newer),
            "detail": self.detail,
        }


def watched_engine(recipe: str, variants: tuple[str, ...], image: ImageSpec) -> Watched:
    base = Watched(recipe, variants, "image", image.name, image.tag, image.digest)
    if image.build == "pull" or not image.context:
        return base
    engine = load_facts(source_root() / "images" / image.context).engine
    if engine.source == "base":
        return base
    if engine.source == "lock":
        package, _, version = engine.requirements[0].partition("==")
        return Watched(recipe, variants, "pypi", package.strip(), version.strip())
    repo = image.build_args.get("VLLM_REPO") or image.build_args.get("PATCH_REPO") or "git"
    ref = image.build_args.get("VLLM_REF") or image.engine_commit or image.engine_version
    return Watched(recipe, variants, "git", repo, ref, image.engine_commit)


def recipe_engines(recipe: Recipe) -> list[Watched]:
    """The default's engine build and each variant's own, once each."""
    found: dict[tuple[str, ...], Watched] = {(): watched_engine(recipe.name, (), recipe.image)}
    for name, variant in recipe.variants.items():
        if variant.image is not None:
            found.setdefault((name,), watched_engine(recipe.name, (name,), variant.image))
    unique: dict[tuple[str, str, str], Watched] = {}
    for watched in found.values():
        unique.setdefault((watched.source, watched.name, watched.pinned), watched)
    return list(unique.values())


def _version(text: str) -> Version | None:
    try:
        return Version(text.removeprefix("v"))
    except InvalidVersion:
        return None


def newer_tags(pinned: str, tags: Iterable[str]) -> tuple[Status, tuple[str, ...]]:
    """Tags newer than `pinned`, newest first; 'unordered' when the pinned tag has no order."""
    pinned_version = _version(pinned)
    if pinned_version is not None:
        found = [
            (version, tag)
            for tag in tags
            if (version := _version(tag)) is not None
            and version > pinned_version
            and (not version.is_prerelease or pinned_version.is_prerelease)
        ]
        ordered = tuple(tag for _, tag in sorted(found, reverse=True))
        return ("newer" if ordered else "current"), ordered
    dated = _DATED.match(pinned)
    if dated is None:
        return "unordered", ()
    later = sorted(
        (
            (_build_order(match), tag)
            for tag in tags
            if (match := _DATED.match(tag)) is not None
            and match["name"] == dated["name"]
            and _build_order(match) > _build_order(dated)
        ),
        reverse=True,
    )
    ordered = tuple(tag for _, tag in later)
    return ("newer" if ordered else "current"), ordered


def _build_order(match: re.Match[str]) -> tuple[str, int]:
    """A dated build's place: its date, then its rebuild number (none is 0)."""
    return match["date"], int(match["rebuild"] or 0)


def _next_page(reply: httpx.Response) -> str | None:
    match = re.search(r'<([^>]+)>;\s*rel="?next"?', reply.headers.get("link", ""))
    return match.group(1) if match else None


def registry_tags(client: httpx.Client, image: ImageName) -> tuple[list[str], bool]:
    """The repository's tags, and whether the list is complete (within MAX_TAG_PAGES)."""
    base = registry_url(image)
    url: str | None = f"{base}/v2/{image.repository}/tags/list?n={TAG_PAGE}"
    headers: dict[str, str] = {}
    tags: list[str] = []
    for _ in range(MAX_TAG_PAGES):
        if url is None:
            break
        reply = client.get(url, headers=headers)
        challenge = reply.headers.get("www-authenticate", "")
        if reply.status_code == 401 and challenge.lower().startswith("bearer"):
            headers = {
                "Authorization": f"Bearer {bearer_token(client, challenge, image.repository)}"
            }
            reply = client.get(url, headers=headers)
        reply.raise_for_status()
        tags.extend(str(tag) for tag in reply.json().get("tags") or [])
        following = _next_page(reply)
        url = f"{base}{following}" if following and following.startswith("/") else following
    return tags, url is None


def pypi_versions(client: httpx.Client, package: str) -> list[str]:
    base = os.environ.get(PYPI_ENV, PYPI_URL).rstrip("/")
    reply = client.get(f"{base}/pypi/{package}/json")
    reply.raise_for_status()
    releases = reply.json().get("releases") or {}
    return [
        version
        for version, files in releases.items()
        if not files or not all(f.get("yanked") for f in files)
    ]


def check(client: httpx.Client, watched: Watched) -> Update:
    if watched.source == "git":
        pinned = f" (pinned commit {watched.pin})" if watched.pin else ""
        return Update(
            watched, "not-watched", detail=f"engine built from a git ref: compare by hand{pinned}"
        )
    complete = True
    try:
        if watched.source == "pypi":
            names = pypi_versions(client, watched.name)
        else:
            names, complete = registry_tags(client, parse_name(watched.name, watched.pinned))
    except httpx.HTTPStatusError as exc:
        return Update(watched, "unreachable", detail=f"HTTP {exc.response.status_code}")
    except (httpx.HTTPError, ValueError) as exc:
        return Update(watched, "unreachable", detail=type(exc).__name__)
    status, newer = newer_tags(watched.pinned, names)
    detail = "the pinned tag is not a version or a dated build" if status == "unordered" else ""
    if not complete:
        status = "newer" if newer else "incomplete"
        detail = f"read the first {len(names):,} tags only"
    moved = _moved_off_digest(client, watched)
    if moved:
        return Update(watched, "moved", newer, moved)
    return Update(watched, status, newer, detail)


def _moved_off_digest(client: httpx.Client, watched: Watched) -> str:
    """What the pinned tag names now, when that is no longer the recipe's digest ('' when it
    still is, or when the image is not pinned by digest)."""
    if watched.source != "image" or not watched.pin:
        return ""
    try:
        current = fetch_digest(client, parse_name(watched.name, watched.pinned))
    except PinError:
        return ""  # the tag list answered; a missing manifest says nothing about the pin
    if current == watched.pin:
        return ""
    return f"{watched.pinned} now names {current}, not the pinned {watched.pin}"


class OfflineError(SM120Error):
    """No registry answered: nothing could be checked."""


def find_updates(recipes: Iterable[Recipe], timeout_s: float = 15.0) -> list[Update]:
    """Every recipe's engine builds checked; OfflineError when none could be."""
    with httpx.Client(timeout=timeout_s, follow_redirects=True) as client:
        updates = [check(client, w) for recipe in recipes for w in recipe_engines(recipe)]
    if not any(u.checked for u in updates) and any(u.status == "unreachable" for u in updates):
        raise OfflineError(
            "offline: no registry or PyPI answered, so no recipe was checked",
            "it needs the network; SM120_REGISTRY_MIRROR and SM120_PYPI_URL name mirrors",
        )
    return updates
