"""Score failure naming against real logs labelled with the failures they show.

The labelled set (tests/data/failure_logs/cases.yaml) lists each log, the ids it must be
named by, and whether the engine went silent after it. Healthy logs are labelled with no ids
and are named twice, as if the engine had gone silent and as if not: neither may name
anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from sm120.logs.diagnosis.naming import name_failures
from sm120.logs.failures import Diagnosis


class LabelledLog(BaseModel):
    """One real log and what it must be named by."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(description="Path of the log, relative to the cases file's parent.")
    expect: tuple[str, ...] = Field(description="Catalogue ids to name; empty = healthy.")
    silent: bool = Field(default=False, description="The engine printed nothing afterwards.")
    engine: str = Field(min_length=1, description="Engine and version the log comes from.")
    source: str = Field(min_length=1, description="Where the excerpt was copied from.")
    note: str | None = Field(default=None, description="Cuts, joins, caveats.")

    @property
    def healthy(self) -> bool:
        return not self.expect


@dataclass(frozen=True)
class Outcome:
    case: LabelledLog
    named: tuple[str, ...]

    @property
    def right(self) -> bool:
        return set(self.named) == set(self.case.expect)


@dataclass
class Score:
    failures: list[Outcome] = field(default_factory=list)
    healthy: list[Outcome] = field(default_factory=list)

    @property
    def named_right(self) -> int:
        return sum(outcome.right for outcome in self.failures)

    @property
    def false_alarms(self) -> list[Outcome]:
        return [outcome for outcome in self.healthy if outcome.named]

    def summary(self) -> str:
        total = len(self.failures)
        share = 100.0 * self.named_right / total if total else 0.0
        return (
            f"named right: {self.named_right}/{total} ({share:.0f}%); "
            f"false alarms: {len(self.false_alarms)}/{len(self.healthy)} healthy logs"
        )


def load_cases(cases_file: Path) -> list[LabelledLog]:
    raw = yaml.safe_load(cases_file.read_text(encoding="utf-8"))
    return [LabelledLog.model_validate(item) for item in raw]


def healthy_captures(folder: Path, labelled: list[LabelledLog], base: Path) -> list[LabelledLog]:
    """Every log in `folder` that the labelled set does not list, as a healthy case."""
    listed = {(base / case.file).resolve() for case in labelled}
    return [
        LabelledLog(
            file=str(path.relative_to(base)),
            expect=(),
            engine="see SOURCES.md",
            source=str(path.relative_to(base)),
        )
        for path in sorted(folder.glob("*.log"))
        if path.resolve() not in listed
    ]


def score(cases: list[LabelledLog], base: Path) -> Score:
    result = Score()
    for case in cases:
        lines = (base / case.file).read_text(encoding="utf-8").splitlines()
        if case.healthy:
            named = {found.id for silent in (False, True) for found in _named(lines, silent)}
            result.healthy.append(Outcome(case, tuple(sorted(named))))
        else:
            named_ids = tuple(found.id for found in _named(lines, case.silent))
            result.failures.append(Outcome(case, named_ids))
    return result


def _named(lines: list[str], silent: bool) -> list[Diagnosis]:
    return name_failures(lines, went_silent=silent)
