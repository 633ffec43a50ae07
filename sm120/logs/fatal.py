"""Is an engine's start-up already lost? Read from its log lines alone (no I/O, no clock).

vLLM V1 and SGLang run the model in child processes. When one of those dies while the engine
starts, the API process often stays alive (vLLM's waits on a handshake that never comes), so
neither a process exit nor /health says anything until the ready timeout. The log does: each
engine prints a known line as it gives up (sm120/data/startup_fatal.yaml), and some failures of
the catalogue (sm120/data/failures.yaml, `fatal: true`) are only ever printed by a dying engine.

`StartupWatch` is fed every line while a launch waits; `feed` says when the start is lost, and
`verdict()` names why: the catalogue entry when one matched (before or after the fatal line),
else the engine's own error, the first exception line from the fatal line on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from sm120.core.errors import SM120Error
from sm120.core.yaml_data import load_yaml
from sm120.logs.failures import Diagnoser, Diagnosis, checked_signature
from sm120.logs.logparse import clean_line

SIGNATURES_FILE = "startup_fatal.yaml"
Engine = Literal["vllm", "sglang"]

# A Python exception as a traceback ends: "ValueError: ...", "torch.OutOfMemoryError: ...",
# "vllm.v1.engine.exceptions.EngineDeadError: ...", behind any log prefix.
_EXCEPTION = re.compile(
    r"(?:^|(?<=[\s\]|:]))((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failed))"
    r"(?::\s.*|:?$)"
)
# vLLM's record header "INFO 11-21 00:08:26 [file.py:82] " (SGLang's "[2025-05-20 10:00:00] ").
_LOG_HEADER = re.compile(r"^.*?(?:\[[\w./-]+:\d+\]|\[\d{4}-\d\d-\d\d [\d:.]+(?: [^\]]*)?\]) ")
_LONGEST = 300
# "See root cause above." (vLLM's API side), "See stack trace for root cause." (its core).
_ROOT_CAUSE_ABOVE = re.compile(r"(?i)see (?:the )?(?:root cause above|stack trace for root cause)")


class SignatureFileError(SM120Error):
    """sm120/data/startup_fatal.yaml does not load: an editing or packaging mistake."""


class FatalSignature(BaseModel):
    """One line after which an engine's start-up is lost."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Engine = Field(description="The engine whose log prints the line.")
    signature: str = Field(
        min_length=1, description="Regex searched (not anchored) in one ANSI-stripped line."
    )
    source: str = Field(min_length=1, description="The engine file and releases it comes from.")
    note: str = Field(min_length=1, description="Why the line is fatal.")

    @field_validator("signature")
    @classmethod
    def _compiles(cls, signature: str) -> str:
        return checked_signature(signature)


@dataclass(frozen=True)
class FatalStart:
    """Why a start-up is lost. `line` is the line that showed it; `error` the engine's own
    error (an exception line, else the fatal line's message); `failure` the catalogue entry
    that names the cause, when one matched."""

    line: str
    error: str
    failure: Diagnosis | None

    def describe(self) -> str:
        """The failure in one line: the catalogue's title when known, else the engine's error."""
        if self.failure is not None:
            return f"{self.failure.id} {self.failure.title}"
        return self.error


def parse_signatures(text: str, origin: str = SIGNATURES_FILE) -> tuple[FatalSignature, ...]:
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as exc:
        raise SignatureFileError(f"{origin}: malformed YAML: {str(exc).splitlines()[0]}") from None
    try:
        return tuple(TypeAdapter(list[FatalSignature]).validate_python(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise SignatureFileError(f"{origin}: entry {where}: {first['msg']}") from None


@lru_cache(maxsize=1)
def shipped_signatures() -> tuple[FatalSignature, ...]:
    path = resources.files("sm120.data").joinpath(SIGNATURES_FILE)
    return parse_signatures(path.read_text(encoding="utf-8"))


@lru_cache(maxsize=4)
def _patterns(engine: str | None) -> tuple[re.Pattern[str], ...]:
    return tuple(
        re.compile(entry.signature)
        for entry in shipped_signatures()
        if engine is None or entry.engine == engine
    )


class StartupWatch:
    """Feed it every line of a start-up; it trips on the first line that shows the start is
    lost and keeps reading after that, so the verdict can name the cause printed below.

    `engine` limits the engine signatures to one engine (None: every engine's); `sm` limits
    the catalogue as sm120.logs.failures.diagnose does.
    """

    def __init__(self, *, engine: str | None = None, sm: int | None = None) -> None:
        self._patterns = _patterns(engine)
        self._diagnoser = Diagnoser(sm=sm)
        self._fatal_line: str | None = None
        self._error: str | None = None
        # The last exception before the fatal line: the root cause when the fatal line is only
        # a wrapper that points "above" (the API side of a dead engine core), or when nothing
        # after the fatal line names one.
        self._error_before: str | None = None

    @property
    def tripped(self) -> bool:
        return self._fatal_line is not None

    def feed(self, line: str) -> bool:
        """True once, for the line that shows the start-up is lost."""
        text = clean_line(line)
        newly_found = self._diagnoser.feed(text)
        error = _exception_in(text)
        if self._fatal_line is not None:
            if self._error is None and error is not None:
                self._error = error
            return False
        if any(found.fatal for found in newly_found) or any(
            pattern.search(text) for pattern in self._patterns
        ):
            self._fatal_line = text
            self._error = error
            return True
        if error is not None:
            self._error_before = error
        return False

    def verdict(self) -> FatalStart | None:
        if self._fatal_line is None:
            return None
        failures = [found for found in self._diagnoser.results() if found.fatal]
        error = self._error
        if self._error_before and (error is None or _ROOT_CAUSE_ABOVE.search(error)):
            error = self._error_before
        error = error or _message(self._fatal_line)
        return FatalStart(
            line=self._fatal_line,
            error=_shorten(error),
            failure=failures[0] if failures else None,
        )


def watch_lines(
    lines: list[str], *, engine: str | None = None, sm: int | None = None
) -> FatalStart | None:
    """The verdict on a whole log (a replay): None when nothing in it is fatal."""
    watch = StartupWatch(engine=engine, sm=sm)
    for line in lines:
        watch.feed(line)
    return watch.verdict()


def _exception_in(text: str) -> str | None:
    found = _EXCEPTION.search(_message(text))
    return found.group(0).strip() if found else None


def _message(text: str) -> str:
    """The line without the engine's record header (process, level, time, file)."""
    header = _LOG_HEADER.match(text)
    return (text[header.end() :] if header else text).strip()


def _shorten(text: str) -> str:
    return text if len(text) <= _LONGEST else text[: _LONGEST - 1] + "…"
