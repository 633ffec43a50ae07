"""Gate cases as data: the schema of sm120/data/gates.yaml (or a file given with --cases)."""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sm120.core.bounded import MIB, read_text_capped
from sm120.core.errors import RecipeError, SM120Error
from sm120.core.suggest import did_you_mean
from sm120.recipe.loader import parse_yaml

GATES_PACKAGE = "sm120.data"
GATES_FILE = "gates.yaml"


class CasesError(SM120Error):
    """A gate file that does not load, or a suite / case that does not exist."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _compiles(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regex ({exc})") from None
    return pattern


class ToolExpectation(Strict):
    name: str = Field(description="The function the model must call.")
    arguments: dict[str, str] = Field(
        default_factory=dict,
        description="Argument name -> regex its value must match (case-insensitive).",
    )

    @field_validator("arguments")
    @classmethod
    def _patterns(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern in value.values():
            _compiles(pattern)
        return value


class Check(Strict):
    regex: str | None = Field(None, description="Must match the answer (content).")
    not_regex: str | None = Field(None, description="Must not match the answer.")
    tool_call: ToolExpectation | None = Field(None, description="A parsed tool call to expect.")
    description: str | None = Field(None, description="What the check means, for reports.")

    @model_validator(mode="after")
    def _one_kind(self) -> Check:
        kinds = [k for k in (self.regex, self.not_regex, self.tool_call) if k is not None]
        if len(kinds) != 1:
            raise ValueError("a check has exactly one of regex, not_regex, tool_call")
        for pattern in (self.regex, self.not_regex):
            if pattern is not None:
                _compiles(pattern)
        return self

    def describe(self) -> str:
        if self.description:
            return self.description
        if self.tool_call is not None:
            return f"a {self.tool_call.name} tool call"
        if self.regex is not None:
            return f"matches /{self.regex}/"
        return f"does not match /{self.not_regex}/"


class Needle(Strict):
    text: str = Field(description="The sentence to hide in the document.")
    depth: float = Field(ge=0.0, le=1.0, description="Where: 0 the start, 1 the end.")


class Document(Strict):
    tokens: int = Field(gt=0, description="Target size in tokens (shrunk to fit the plan).")
    seed: int = Field(0, description="Seed of the filler text, for reruns on the same text.")
    needles: tuple[Needle, ...] = Field((), description="Facts placed in the document.")


class Turn(Strict):
    user: str = Field(description="The user's message (after the document, if any).")
    document: Document | None = Field(None, description="A generated document sent first.")
    expect: tuple[Check, ...] = Field((), description="Checks on this turn's answer.")


class ToolSpec(Strict):
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(description="JSON schema of the arguments.")

    def for_chat(self) -> dict[str, Any]:
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": self.parameters}}

    def for_messages(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.parameters,
        }


class Case(Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str
    api: Literal["chat", "messages"] = Field("chat", description="Which API to ask through.")
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    turns: tuple[Turn, ...] = Field(min_length=1)


class Suite(Strict):
    description: str
    cases: tuple[Case, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> Suite:
        ids = [case.id for case in self.cases]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate case ids: {', '.join(duplicates)}")
        return self


class RandomModel(Strict):
    """What a gate checks when the model is random (the tiny recipe's generated one)."""

    why: str = Field(description="What a random model can and cannot show, for the report.")
    expect: tuple[Check, ...] = Field(
        min_length=1, description="The checks every turn gets instead of its own."
    )


class GateFile(Strict):
    suites: dict[str, Suite]
    random_model: RandomModel | None = Field(
        None, description="The checks for a random model (its answers are noise)."
    )


def for_random_model(case: Case, random: RandomModel) -> Case:
    """The case with every turn's checks replaced by what a random model can pass."""
    turns = tuple(turn.model_copy(update={"expect": random.expect}) for turn in case.turns)
    return case.model_copy(update={"turns": turns})


def parse_gate_file(text: str, where: str) -> GateFile:
    try:
        # The recipes' loader: aliases, nesting and huge numbers bounded the same way.
        data = parse_yaml(text, where)
    except RecipeError as exc:
        raise CasesError(exc.message, exc.hint) from None
    try:
        return GateFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        raise CasesError(
            f"{where}: {location}: {first['msg']}", "see sm120/data/gates.yaml for the format"
        ) from None


@lru_cache(maxsize=1)
def builtin_gates() -> GateFile:
    text = resources.files(GATES_PACKAGE).joinpath(GATES_FILE).read_text(encoding="utf-8")
    return parse_gate_file(text, GATES_FILE)


# A gate file is a few KB of prompts and expectations (long prompts are generated).
MAX_CASES_BYTES = 4 * MIB


def load_gates(path: Path | None) -> GateFile:
    if path is None:
        return builtin_gates()
    try:
        text = read_text_capped(path, MAX_CASES_BYTES, "--cases", "check --cases")
    except SM120Error as exc:
        raise CasesError(exc.message, exc.hint) from None
    return parse_gate_file(text, str(path))


def select(gates: GateFile, suite: str, case_ids: tuple[str, ...] = ()) -> tuple[Case, ...]:
    if suite not in gates.suites:
        raise CasesError(
            f"no gate suite '{suite}'{did_you_mean(suite, gates.suites)}",
            f"suites: {', '.join(gates.suites)}",
        )
    cases = gates.suites[suite].cases
    if not case_ids:
        return cases
    known = {case.id: case for case in cases}
    for wanted in case_ids:
        if wanted not in known:
            raise CasesError(
                f"suite '{suite}' has no case '{wanted}'{did_you_mean(wanted, known)}",
                f"cases: {', '.join(known)}",
            )
    return tuple(known[wanted] for wanted in case_ids)
