"""The search space a recipe declares (its `tune:` block), checked before anything runs.

A knob is a `--set` key: an engine flag without dashes or a recipe key. Each value a knob may
take is planned on its own first, and the planner's value rules (S03-S05, the flag
catalogue's types and bounds) refuse what they would refuse at launch: a space that names a
flag the engine lacks, or a value the planner will never accept, is an error in the recipe,
said in one line, before any GPU time is spent.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from sm120.core.errors import PlanError, SM120Error
from sm120.core.suggest import did_you_mean
from sm120.plan.overrides import SETTABLE_SCALARS, SETTABLE_SECTIONS, parse_assignment
from sm120.plan.resolve import LaunchPlan, PlanRequest, resolve
from sm120.plan.rules import value_problems
from sm120.recipe.catalogue import engine_flags
from sm120.recipe.schema import Recipe, Tune, TuneRange

# A range that expands to more values than this is a typo (step 1 over 1..65536).
MAX_VALUES_PER_KNOB = 32


class TuneError(SM120Error):
    """The search cannot run as asked."""


def set_text(knob: str, value: Any) -> str:
    """The `--set` text of one setting; JSON for what is not a plain string."""
    shown = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return f"{knob}={shown}"


@dataclass(frozen=True)
class Candidate:
    """One configuration: the default plus these settings (and a variant, if any)."""

    settings: tuple[tuple[str, Any], ...] = ()
    variant: str | None = None

    @property
    def sets(self) -> tuple[str, ...]:
        return tuple(set_text(knob, value) for knob, value in self.settings)

    @property
    def is_default(self) -> bool:
        return not self.settings and self.variant is None

    @property
    def label(self) -> str:
        parts = list(self.sets) + ([f"-V {self.variant}"] if self.variant else [])
        return " ".join(parts) or "default"

    @property
    def key(self) -> str:
        """Stable across runs: how a resumed search finds what it measured."""
        return hashlib.sha256(self.label.encode()).hexdigest()[:12]

    def with_setting(self, knob: str, value: Any) -> Candidate:
        kept = tuple((k, v) for k, v in self.settings if k != knob)
        return Candidate((*kept, (knob, value)), self.variant)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "settings": dict(self.settings),
            "sets": list(self.sets),
            "variant": self.variant,
        }


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple[Any, ...]
    default: Any  # the plan's own value (None: the engine's default, unknown here)

    def alternatives(self) -> tuple[Any, ...]:
        return tuple(value for value in self.values if value != self.default)


@dataclass(frozen=True)
class Space:
    knobs: tuple[Knob, ...]
    variants: tuple[str, ...]
    block: Tune
    base: PlanRequest = field(repr=False)

    @property
    def size(self) -> int:
        """Candidates a full one-knob-at-a-time pass tries, the default included."""
        return 1 + sum(len(knob.alternatives()) for knob in self.knobs) + len(self.variants)


def tune_block(recipe: Recipe, variants: tuple[str, ...]) -> Tune:
    """The last chosen variant's block, else the recipe's."""
    for name in reversed(variants):
        block = recipe.variants[name].tune
        if block is not None:
            return block
    if recipe.tune is None:
        raise TuneError(
            f"recipe '{recipe.name}' declares no tune: block",
            "add one (knobs and their values; see docs/tune.md) or pick a variant that has it",
        )
    return recipe.tune


def build_space(recipe: Recipe, base: PlanRequest, plan: LaunchPlan) -> Space:
    """The recipe's space for `plan` (the default as this request resolves it), every knob
    and value checked."""
    block = tune_block(recipe, plan.variants)
    if not block.knobs and not block.variants:
        raise TuneError(
            f"the tune: block of '{recipe.name}' names no knobs and no variants",
            "give it at least one knob with two values",
        )
    fixed = {text.partition("=")[0].strip().lstrip("-") for text in base.sets}
    for name in block.knobs:
        if name in fixed:
            raise TuneError(
                f"tune knob '{name}' is also fixed by --set {name}",
                "drop the --set, or the knob from the recipe's tune: block",
            )
    knobs = tuple(_knob(name, values, base, recipe, plan) for name, values in block.knobs.items())
    for variant in block.variants:
        if variant not in recipe.variants:
            raise TuneError(
                f"tune: variant '{variant}' is not a variant of '{recipe.name}'"
                f"{did_you_mean(variant, recipe.variants)}",
                f"variants: {', '.join(recipe.variants) or 'none'}",
            )
    return Space(knobs, block.variants, block, base)


def _knob(
    name: str,
    declared: tuple[Any, ...] | TuneRange,
    base: PlanRequest,
    recipe: Recipe,
    plan: LaunchPlan,
) -> Knob:
    _check_name(name, plan.engine)
    values = _expand(name, declared, plan.engine)
    for value in values:
        _check_value(name, value, base, recipe)
    return Knob(name, values, _current(plan, name))


def _check_name(name: str, engine: str) -> None:
    flags = engine_flags(engine)
    head, _, rest = name.partition(".")
    if name in flags.reserved:
        raise TuneError(
            f"tune knob '{name}' is set by sm120 itself and cannot be tuned",
            "drop it from the recipe's tune: block",
        )
    if name in flags.flags or (head in SETTABLE_SECTIONS and rest) or name in SETTABLE_SCALARS:
        return
    known = list(flags.flags)
    raise TuneError(
        f"tune knob '{name}' is not a {engine} flag{did_you_mean(name, known)}",
        f"knobs are --set keys: a {engine} flag without dashes (sm120/data/engine_flags.yaml) "
        "or a recipe key such as env.NCCL_P2P_DISABLE",
    )


def _expand(name: str, declared: tuple[Any, ...] | TuneRange, engine: str) -> tuple[Any, ...]:
    if not isinstance(declared, TuneRange):
        values = tuple(dict.fromkeys(json.dumps(v, sort_keys=True) for v in declared))
        if not values:
            raise TuneError(f"tune knob '{name}' lists no values", "give it two or more")
        return tuple(json.loads(v) for v in values)
    spec = engine_flags(engine).flags.get(name)
    whole = (spec is not None and spec.type == "int") or all(
        float(x).is_integer() for x in (declared.min, declared.max, declared.step or 1)
    )
    found: list[float] = []
    value = declared.min
    while value <= declared.max * (1 + 1e-9) and len(found) <= MAX_VALUES_PER_KNOB:
        found.append(value)
        value = value * declared.factor if declared.factor else value + (declared.step or 1)
    if len(found) > MAX_VALUES_PER_KNOB:
        raise TuneError(
            f"tune knob '{name}': the range gives more than {MAX_VALUES_PER_KNOB} values",
            "use a larger step or factor, or list the values",
        )
    return tuple(round(v) if whole else round(v, 6) for v in found)


def _check_value(name: str, value: Any, base: PlanRequest, recipe: Recipe) -> None:
    """Plan the default with this one value: the planner's own refusals, word for word."""
    text = set_text(name, value)
    try:
        parse_assignment(text, recipe.engine)
        plan = resolve(_with_sets(base, (text,)), recipe)
    except PlanError as exc:
        raise TuneError(
            f"tune knob {text}: the planner refuses it: {exc.message}",
            "narrow the knob's values in the recipe's tune: block",
        ) from None
    problems = value_problems(plan)
    if problems:
        raise TuneError(
            f"tune knob {text}: the planner refuses it: {problems[0]}",
            "narrow the knob's values in the recipe's tune: block",
        )


def _with_sets(base: PlanRequest, sets: tuple[str, ...]) -> PlanRequest:
    return replace(base, tuned=sets)


def candidate_request(base: PlanRequest, candidate: Candidate) -> PlanRequest:
    """The plan request of a candidate: its settings as the tuned layer (under the command
    line's --set, as a launch applies a result), its variant after the chosen ones."""
    variants = base.variants + ((candidate.variant,) if candidate.variant else ())
    return replace(base, variants=variants, tuned=candidate.sets)


def _current(plan: LaunchPlan, name: str) -> Any:
    head, _, rest = name.partition(".")
    if not rest:
        return plan.arg(name)
    if head in ("env", "args"):
        return plan.env_dict.get(rest) if head == "env" else plan.arg(rest)
    return None  # a recipe key: its default is whatever the recipe says, not compared
