"""Which startup phase an engine is in, read from its log lines.

vLLM is the target; SGLang lines are recognised where they are distinctive (best effort).
Lines may carry any prefix (docker-compose `name  | `, `(EngineCore pid=12) `, timestamps)
and ANSI colour codes: patterns are searched, never anchored at the start.

The phase order follows what vLLM V1 actually does: the KV cache is sized (and its size
logged) after the profiling run that compiles the model, and only then are CUDA graphs
captured. Phases only move forward, so a late weights line from a slow rank cannot drag the
display back.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

# CSI sequences (colours, cursor moves) and the two-byte escapes.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def clean_line(line: str) -> str:
    """Drop ANSI colour codes and the line ending; leave everything else as written."""
    return _ANSI_ESCAPE.sub("", line).rstrip("\r\n")


class Phase(str, Enum):
    """Startup phases in the order an engine goes through them (members named as their values)."""

    starting = "starting"
    loading_weights = "loading_weights"
    compiling = "compiling"
    kv_cache = "kv_cache"
    capturing_graphs = "capturing_graphs"
    api_starting = "api_starting"
    ready = "ready"


_PHASE_RANK = {phase: rank for rank, phase in enumerate(Phase)}


@dataclass(frozen=True)
class PhaseUpdate:
    """The tracker entered `phase`, or learnt a new `detail` about it, at time `at`."""

    phase: Phase
    detail: str | None
    at: float


Describe = Callable[[re.Match[str], str], str | None]


@dataclass(frozen=True)
class _Rule:
    phase: Phase
    pattern: re.Pattern[str]
    describe: Describe | None = None


def _progress(match: re.Match[str], line: str) -> str | None:
    """k/N from a tqdm bar that follows the matched text, if the line has one."""
    counts = re.search(r"\b(\d+)/(\d+)\b", line[match.end() :])
    return f"{counts[1]}/{counts[2]}" if counts else None


def _shards(match: re.Match[str], line: str) -> str | None:
    progress = _progress(match, line)
    return f"{progress} shards" if progress else None


def _graphs(match: re.Match[str], line: str) -> str | None:
    progress = _progress(match, line)
    kind = match["kind"]
    if progress and kind:
        return f"{progress} graphs ({kind})"
    if progress:
        return f"{progress} graphs"
    return kind


def _compile_range(_match: re.Match[str], line: str) -> str | None:
    compile_range = re.search(r"compile range (\(\d+, ?\d+\))", line)
    return f"compile range {compile_range[1]}" if compile_range else None


def _kv_size(match: re.Match[str], _line: str) -> str:
    return f"KV cache {match['tokens'] or match['sglang_tokens']} tokens"


def _template(text: str) -> Describe:
    return lambda match, _line: text.format(**match.groupdict())


def _rule(phase: Phase, pattern: str, describe: Describe | None = None) -> _Rule:
    return _Rule(phase, re.compile(pattern), describe)


_KV_TOKENS = re.compile(
    r"(?:GPU|CPU) KV cache size: (?P<tokens>[\d,]+) tokens"
    r"|KV Cache is allocated\. #tokens: (?P<sglang_tokens>\d+)"
)

# Checked in order; the first rule that matches decides the line.
_RULES: tuple[_Rule, ...] = (
    _rule(Phase.ready, r"Application startup complete\."),
    _rule(Phase.ready, r"The server is fired up and ready to roll"),
    _rule(
        Phase.api_starting,
        r"Starting vLLM (?:API )?server(?: \d+)? on (?P<url>\S+)",
        _template("{url}"),
    ),
    _rule(
        Phase.api_starting,
        r"Available routes are|Started server process|Waiting for application startup",
    ),
    _rule(Phase.capturing_graphs, r"(?i)Capturing CUDA ?graphs(?: \((?P<kind>[^)]*)\))?", _graphs),
    _rule(Phase.capturing_graphs, r"Capturing batches \((?P<kind>[^)]*)\)", _graphs),
    _rule(Phase.capturing_graphs, r"Capture cuda graph begin"),
    _rule(
        Phase.capturing_graphs,
        r"Graph capturing finished in (?P<secs>[\d.]+) secs?, took (?P<gib>[\d.]+) GiB",
        _template("graphs captured in {secs} s ({gib} GiB)"),
    ),
    _rule(Phase.kv_cache, _KV_TOKENS.pattern, _kv_size),
    _rule(
        Phase.kv_cache,
        r"Available KV cache memory: (?P<gib>[\d.]+) GiB",
        _template("{gib} GiB for the KV cache"),
    ),
    _rule(
        Phase.kv_cache, r"# (?:GPU|CUDA) blocks: (?P<blocks>\d+)", _template("{blocks} GPU blocks")
    ),
    # vLLM V1 (GPU) measures what CUDA graphs will take after the compiling profile run and
    # before it sizes the KV cache.
    _rule(Phase.kv_cache, r"Profiling CUDA graph memory"),
    _rule(
        Phase.compiling,
        r"Dynamo bytecode transform|Compiling a graph for|Compiling graph for|torch\.compile takes"
        r"|torch\.compile:|for vLLM's torch\.compile|Cache the graph of compile range"
        r"|Directly load the compiled graph",
        _compile_range,
    ),
    # vLLM's CPU runner compiles in a warm-up run of its own (cpu_model_runner.py), where an
    # inductor C++ compile error kills the start; without these the phase stayed at weights.
    _rule(
        Phase.compiling,
        r"Warming up model for the compilation|Initial profiling/warmup run took|Warming up done\.",
    ),
    _rule(Phase.loading_weights, r"Loading (?:safetensors )?checkpoint shards", _shards),
    _rule(
        Phase.loading_weights,
        r"Model loading took (?P<gib>[\d.]+) GiB(?: memory)? and (?P<secs>[\d.]+) seconds",
        _template("model loaded: {gib} GiB in {secs} s"),
    ),
    _rule(
        Phase.loading_weights,
        r"Loading weights took (?P<secs>[\d.]+) seconds",
        _template("weights loaded in {secs} s"),
    ),
    _rule(Phase.loading_weights, r"Starting to load model|Load weight begin|Load weight end"),
)


def _classify(line: str) -> tuple[Phase, str | None] | None:
    for rule in _RULES:
        match = rule.pattern.search(line)
        if match:
            return rule.phase, rule.describe(match, line) if rule.describe else None
    return None


def _kv_tokens(line: str) -> int | None:
    match = _KV_TOKENS.search(line)
    if not match:
        return None
    return int((match["tokens"] or match["sglang_tokens"]).replace(",", ""))


class StartupTracker:
    """Follows one engine start from its log lines; feed every line as it arrives."""

    def __init__(self, started_at: float | None = None) -> None:
        self._started_at = started_at
        self._entries: list[PhaseUpdate] = []
        self._detail: str | None = None
        self._last_seen: float | None = started_at
        self.kv_cache_tokens: int | None = None

    @property
    def phase(self) -> Phase:
        return self._entries[-1].phase if self._entries else Phase.starting

    @property
    def detail(self) -> str | None:
        return self._detail

    @property
    def is_ready(self) -> bool:
        return self.phase is Phase.ready

    @property
    def transitions(self) -> tuple[PhaseUpdate, ...]:
        """The update that opened each phase, in order (starting included)."""
        return tuple(self._entries)

    def feed(self, line: str, now: float) -> PhaseUpdate | None:
        """Returns an update when the phase or its detail changed, else None."""
        self._note_time(now)
        update = None
        # tqdm redraws with carriage returns; a captured "line" can hold many redraws.
        for segment in clean_line(line).split("\r"):
            update = self._feed_segment(segment, now) or update
        return update

    def durations(self, now: float | None = None) -> list[tuple[Phase, float]]:
        """Seconds spent in each phase entered so far, in order.

        `ready` is the end point, not a phase with a duration. The current phase runs until
        `now`, or until the last fed line when `now` is not given. The durations add up to the
        time from the start to `ready` (or to now).
        """
        if not self._entries:
            return []
        end = self._last_seen if now is None else now
        timed: list[tuple[Phase, float]] = []
        for entry, following in zip(self._entries, [*self._entries[1:], None], strict=True):
            if entry.phase is Phase.ready:
                break
            until = following.at if following else (end if end is not None else entry.at)
            timed.append((entry.phase, max(0.0, until - entry.at)))
        return timed

    def _note_time(self, now: float) -> None:
        if self._started_at is None:
            self._started_at = now
        if not self._entries:
            self._entries.append(PhaseUpdate(Phase.starting, None, self._started_at))
        self._last_seen = now

    def _feed_segment(self, segment: str, now: float) -> PhaseUpdate | None:
        tokens = _kv_tokens(segment)
        if tokens is not None:
            self.kv_cache_tokens = tokens
        found = _classify(segment)
        if found is None:
            return None
        phase, detail = found
        if _PHASE_RANK[phase] < _PHASE_RANK[self.phase]:
            return None
        if phase is self.phase:
            if detail is None or detail == self._detail:
                return None
            self._detail = detail
            return PhaseUpdate(phase, detail, now)
        self._detail = detail
        update = PhaseUpdate(phase, detail, now)
        self._entries.append(update)
        return update
