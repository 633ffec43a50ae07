"""The engine flag catalogue and the environment allow-list (data in sm120/data/)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from sm120.core.errors import PlanError
from sm120.core.suggest import did_you_mean
from sm120.core.yaml_data import load_yaml


def _data(name: str) -> Any:
    return load_yaml(resources.files("sm120.data").joinpath(name).read_text("utf-8"))


# Rendered per node from the multinode layout (see sm120/render/multinode.py).
MULTINODE_FLAGS = frozenset({"nnodes", "node-rank", "master-addr", "master-port", "headless"})
# Rendered from the recipe's kv_tier (see sm120/render/kv_tier.py).
KV_TIER_FLAGS = frozenset({"kv-offloading-backend", "kv-offloading-size", "kv-transfer-config"})


@dataclass(frozen=True)
class FlagSpec:
    name: str
    type: str
    choices_key: str | None = None
    minimum: int | None = None
    maximum: int | None = None  # None: the 32-bit limit of rule S04 (counts and lengths)
    negatable: bool = False
    sentinels: tuple[int, ...] = ()  # values below `minimum` the engine reads as a mode


@dataclass(frozen=True)
class EngineFlags:
    engine: str
    flags: dict[str, FlagSpec]
    reserved: frozenset[str]
    flavours: dict[str, dict[str, Any]]

    def choices(self, flavour: str, key: str) -> list[str]:
        """A flavour's list, including what the flavours it extends list."""
        seen: list[str] = []
        current: str | None = flavour
        while current:
            entry = self.flavours.get(current, {})
            seen.extend(c for c in entry.get(key, []) if c not in seen)
            current = entry.get("extends")
        return seen

    def spec(self, name: str) -> FlagSpec:
        if name in self.reserved:
            if name in MULTINODE_FLAGS:
                hint = "multi-node flags come from the recipe's multinode layout and --nodes"
            elif name in KV_TIER_FLAGS:
                hint = "a KV tier comes from the recipe's kv_tier, e.g. --set kv_tier.cpu_gib=32"
            else:
                hint = "use --model-dir, --port, --host or the recipe's model.served_name"

            raise PlanError(f"'{name}' is set by sm120 itself, not by a recipe flag", hint)
        if name not in self.flags:
            raise PlanError(
                f"unknown {self.engine} flag '{name}'{did_you_mean(name, self.flags)}",
                "flags are the engine's own names without dashes; add new ones to "
                "sm120/data/engine_flags.yaml",
            )
        return self.flags[name]


@cache
def engine_flags(engine: str) -> EngineFlags:
    raw = _data("engine_flags.yaml")[engine]
    flags = {
        name: FlagSpec(
            name=name,
            type=spec["type"],
            choices_key=spec.get("choices"),
            minimum=spec.get("min"),
            maximum=spec.get("max"),
            negatable=bool(spec.get("negatable", False)),
            sentinels=tuple(spec.get("sentinels", ())),
        )
        for name, spec in raw["flags"].items()
    }
    return EngineFlags(engine, flags, frozenset(raw["reserved"]), raw["flavours"])


def coerce_flag_value(spec: FlagSpec, value: Any) -> Any:
    """Check a value against its flag's type; JSON flags also accept a JSON string."""
    if value is None:
        return None
    kind = spec.type
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "int_list" and isinstance(value, list) and value and all(_is_int(v) for v in value):
        return value
    if kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind in ("str", "choice") and isinstance(value, str | int | float):
        return str(value)
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                raise PlanError(
                    f"{spec.name}: '{value}' is not valid JSON", "quote the JSON object"
                ) from None
        if isinstance(value, dict | list):
            return value
    wanted = "a list of integers" if kind == "int_list" else f"a {kind} value"
    raise PlanError(
        f"{spec.name} expects {wanted}, got {value!r}",
        "check the value's type (e.g. numbers without quotes)",
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def choice_error(spec: FlagSpec, value: str, choices: list[str]) -> str | None:
    if not choices or value in choices:
        return None
    return f"'{value}' is not a known {spec.name}{did_you_mean(value, choices)}"


@dataclass(frozen=True)
class EnvAllowList:
    names: frozenset[str]
    prefixes: tuple[str, ...]
    invented: dict[str, str]

    def allows(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)


@cache
def env_allow_list(engine: str, flavour: str, extra: tuple[str, ...] = ()) -> EnvAllowList:
    raw = _data("env_vars.yaml")
    names = set(raw["common"]["names"]) | set(extra)
    prefixes = list(raw["common"]["prefixes"])
    if engine == "vllm":
        names |= set(raw["vllm_upstream"]["names"])
    current: str | None = flavour
    while current is not None:  # a flavour that extends another reads that one's names too
        entry = raw["flavours"].get(current, {})
        names |= set(entry.get("names", []))
        prefixes += entry.get("prefixes", [])
        current = entry.get("extends")
    return EnvAllowList(frozenset(names), tuple(prefixes), dict(raw["invented"]))
