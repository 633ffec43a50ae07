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

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml

from sm120.core.bounded import read_text_capped
from sm120.core.errors import SM120Error

ALIAS_HINT = (
    "write NAME=DEPLOYMENT, e.g. --alias claude-sonnet-4-5=glm52 or --alias 'claude-*=glm52'"
)
FILE_HINT = "write a YAML mapping: aliases: {claude-sonnet-4-5: glm52}"
# A model name as clients send them (letters, digits, . _ - : / and wildcards), bounded.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/*?\[\]-]{0,199}")
_TARGET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}")
MAX_ALIAS_FILE_BYTES = 256 * 1024

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
    text = read_text_capped(path, MAX_ALIAS_FILE_BYTES, "alias file", FILE_HINT)
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = f"alias file {path} is not YAML: {exc}".splitlines()[0]
        raise AliasError(first, FILE_HINT) from None
    table = document.get("aliases") if isinstance(document, dict) else None
    if not isinstance(table, dict):
        raise AliasError(f"alias file {path} has no 'aliases:' mapping", FILE_HINT)
    return [checked_alias(str(name), str(target)) for name, target in table.items()]


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
    ordered = sorted(aliases, key=lambda alias: alias.is_pattern)
    for alias in ordered:
        if not alias.matches(model):
            continue
        target = _served_model(alias.target, served, deployment_of)
        return (target, served[target]) if target is not None else None
    return None


def _served_model(
    target: str, served: Mapping[str, Routed], deployment_of: Mapping[str, str]
) -> str | None:
    for model, deployment in deployment_of.items():
        if deployment == target and model in served:
            return model
    return target if target in served else None


def as_table(aliases: Iterable[Alias]) -> dict[str, str]:
    return {alias.name: alias.target for alias in aliases}
