"""Name the catalogue's failures in a whole engine log, as a user would post it.

Beyond the per-line signatures of sm120/logs/failures.py this knows two things a single line does
not: whether the engine was still starting when a line appeared (a stalled shared-memory
broadcast while compiling is slow work, not a wedge), and whether the engine went silent
after its last line (a hang prints nothing, so only the line it stopped after can name it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from sm120.logs.failures import Diagnoser, Diagnosis, FailureMode, load_catalogue
from sm120.logs.phases import Phase, StartupTracker, clean_line

# Phases in which the engine is busy with start-up work of its own.
STARTUP_WORK = frozenset(
    {Phase.loading_weights, Phase.compiling, Phase.capturing_graphs, Phase.kv_cache}
)


def name_failures(
    lines: Iterable[str], *, sm: int | None = None, went_silent: bool = False
) -> list[Diagnosis]:
    """Known failures in a log, in order of first appearance.

    `went_silent`: the engine printed nothing after the last line (it hung). Then an entry
    whose `silent_after` matches that last line is named too, unless a fatal failure was
    already named (a dead engine is silent for its own reason).
    """
    diagnoser = Diagnoser(sm=sm)
    tracker = StartupTracker()
    last = ""
    for line in lines:
        tracker.feed(line, 0.0)
        diagnoser.feed(line, starting=tracker.phase in STARTUP_WORK)
        if line.strip():
            last = line
    found = diagnoser.results()
    if went_silent and not any(named.fatal for named in found):
        found.extend(_silent_after(last, already={named.id for named in found}))
    return found


def _silent_after(last_line: str, *, already: set[str]) -> list[Diagnosis]:
    text = clean_line(last_line)
    named: list[Diagnosis] = []
    for mode, patterns in _silence_rules():
        if mode.id not in already and any(pattern.search(text) for pattern in patterns):
            named.append(
                Diagnosis(id=mode.id, title=mode.title, cause=mode.cause, fix=mode.fix, line=text)
            )
    return named


@lru_cache(maxsize=1)
def _silence_rules() -> tuple[tuple[FailureMode, tuple[re.Pattern[str], ...]], ...]:
    return tuple(
        (mode, tuple(re.compile(pattern) for pattern in mode.silent_after))
        for mode in load_catalogue().values()
        if mode.silent_after
    )
