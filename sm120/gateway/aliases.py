"""Model aliases: a name a client asks for (Claude Code's default and background models, a
Codex profile's model) that reaches the deployment the user chose.

`NAME=DEPLOYMENT` on the command line (`--alias`, repeatable) or in a YAML file
(`--aliases FILE`: `aliases: {NAME: DEPLOYMENT}`). NAME may hold shell-style wildcards
(`claude-*`), so a client that moves to a newer model name still lands somewhere; exact names
are tried before patterns, patterns in the order given. DEPLOYMENT is a deployment's name, or
a model a deployment serves. A model a deployment serves always wins over an alias of the
same name: an alias can add a name, never hide one.
"""

from __future__ import annotations

import datetime
import fnmatch
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sm120.core.bounded import read_text_capped
from sm120.core.errors import SM120Error
from sm120.recipe.loader import parse_yaml

ALIAS_HINT = (
    "write NAME=DEPLOYMENT, e.g. --alias claude-sonnet-4-5=glm52 or --alias 'claude-*=glm52'"
)
FILE_HINT = "write a YAML mapping: aliases: {claude-sonnet-4-5: glm52}"
# A model name as clients send them (letters, digits, . _ - : / and wildcards), bounded.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/*?\[\]-]{0,199}")
_TARGET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}")
MAX_ALIAS_FILE_BYTES = 256 * 1024
# Far above what clients need (a few names each) and small enough that a 404 or /v1/models
# stays cheap; the file's own cap would allow about ten thousand.
MAX_ALIASES = 4096

Routed = TypeVar("Routed")


class AliasError(SM120Error):
    """An alias that cannot be used."""


@dataclass(frozen=True)
class Alias:
    name: str
    target: str

    @property
    def is_pattern(self) -> bool:
        return any(mark in self.name for mark in "*?[")

    def matches(self, model: str) -> bool:
        if self.is_pattern:
            return fnmatch.fnmatchcase(model, self.name)
        return model == self.name


def parse_alias(text: str) -> Alias:
    name, sep, target = text.partition("=")
    if not sep:
        raise AliasError(f"alias {text!r} has no '='", ALIAS_HINT)
    return checked_alias(name.strip(), target.strip())


def checked_alias(name: str, target: str) -> Alias:
    if not _NAME.fullmatch(name):
        raise AliasError(f"alias name {name!r} is not a model name", ALIAS_HINT)
    if not _TARGET.fullmatch(target):
        raise AliasError(f"alias {name!r} points at {target!r}, not a deployment", ALIAS_HINT)
    return Alias(name, target)


def load_alias_file(path: Path) -> list[Alias]:
    """The file's aliases, read with the bounds recipe files have (sm120.recipe.loader:
    nesting, aliases that expand past a bound, duplicate keys); every name and target must
    be text, so YAML's typed scalars (true, 1e3, 2026-01-01) are refused, not renamed."""
    text = read_text_capped(path, MAX_ALIAS_FILE_BYTES, "alias file", FILE_HINT)
    try:
        document = parse_yaml(text, f"alias file {path}")
    except SM120Error as exc:
        raise AliasError(exc.message, FILE_HINT) from None
    table = document.get("aliases") if isinstance(document, dict) else None
    if not isinstance(table, dict):
        raise AliasError(f"alias file {path} has no 'aliases:' mapping", FILE_HINT)
    if len(table) > MAX_ALIASES:
        raise AliasError(
            f"alias file {path} has {len(table):,} aliases; at most {MAX_ALIASES:,} are read",
            "use patterns (claude-*) instead of one alias per name",
        )
    return [
        checked_alias(_text(path, "name", name), _text(path, f"target of {name!r}", target))
        for name, target in table.items()
    ]


def _text(path: Path, what: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    kind = _YAML_KINDS.get(type(value), type(value).__name__)
    shown = value.isoformat() if isinstance(value, datetime.date) else str(value)
    raise AliasError(
        f"alias file {path}: the {what} {shown} is read by YAML as {kind}, not a name",
        f"put it in quotes: '{shown}'",
    )


_YAML_KINDS: dict[type, str] = {
    bool: "a true/false value",
    int: "a number",
    float: "a number",
    datetime.date: "a date",
    datetime.datetime: "a date and time",
    type(None): "nothing (null)",
    list: "a list",
    dict: "a mapping",
}


class AliasTable:
    """The aliases as they are tried, prepared once when they are set: a dict for exact
    names, compiled patterns in the order given. A lookup then costs one dict probe and
    one regex per pattern, not a sort and a scan of every alias (which, with thousands of
    aliases and models, made /v1/models take seconds on the event loop)."""

    def __init__(self, aliases: Iterable[Alias] = ()) -> None:
        self.aliases = tuple(aliases)
        if len(self.aliases) > MAX_ALIASES:
            raise AliasError(
                f"{len(self.aliases):,} aliases given; at most {MAX_ALIASES:,} are kept",
                "use patterns (claude-*) instead of one alias per name",
            )
        self._exact: dict[str, Alias] = {}
        patterns: list[tuple[Callable[[str], object], Alias]] = []
        for alias in self.aliases:
            if alias.is_pattern:
                patterns.append((re.compile(fnmatch.translate(alias.name)).match, alias))
            else:
                self._exact.setdefault(alias.name, alias)
        self._patterns = tuple(patterns)

    def __iter__(self) -> Iterator[Alias]:
        return iter(self.aliases)

    def __len__(self) -> int:
        return len(self.aliases)

    def first_match(self, model: str) -> Alias | None:
        exact = self._exact.get(model)
        if exact is not None:
            return exact
        for matches, alias in self._patterns:
            if matches(model):
                return alias
        return None


def alias_table(aliases: Iterable[Alias]) -> AliasTable:
    return aliases if isinstance(aliases, AliasTable) else AliasTable(aliases)


def merged(*groups: Iterable[Alias]) -> tuple[Alias, ...]:
    """Later groups override earlier ones name by name (the command line over the file)."""
    table: dict[str, Alias] = {}
    for group in groups:
        for alias in group:
            table.pop(alias.name, None)
            table[alias.name] = alias
    return tuple(table.values())


def resolve(
    model: str,
    aliases: Iterable[Alias],
    served: Mapping[str, Routed],
    deployment_of: Mapping[str, str],
) -> tuple[str, Routed] | None:
    """The served model an alias sends `model` to, and what serves it; None when no alias
    names it or its target serves nothing now. `deployment_of` maps served model -> its
    deployment."""
    alias = alias_table(aliases).first_match(model)
    if alias is None:
        return None
    target = served_model(alias.target, served, model_by_deployment(served, deployment_of))
    return (target, served[target]) if target is not None else None


def model_by_deployment(
    served: Mapping[str, Routed], deployment_of: Mapping[str, str]
) -> dict[str, str]:
    """Each deployment's first served model, for targets that name a deployment."""
    found: dict[str, str] = {}
    for model, deployment in deployment_of.items():
        if model in served:
            found.setdefault(deployment, model)
    return found


def served_model(
    target: str, served: Mapping[str, Routed], by_deployment: Mapping[str, str]
) -> str | None:
    found = by_deployment.get(target)
    if found is not None:
        return found
    return target if target in served else None


def as_table(aliases: Iterable[Alias]) -> dict[str, str]:
    return {alias.name: alias.target for alias in aliases}
