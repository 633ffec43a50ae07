"""Turn engine log lines into typed events (sm120/logs/events.py), fast.

Reads vLLM logs from 0.6 to today: V0 and V1 engines, "Pending" (old) and "Waiting",
`(APIServer pid=1)` / `(EngineCore_DP0 pid=7)` / `(Worker_TP0 pid=9)` process prefixes,
docker-compose `name  | ` prefixes, docker `--timestamps`, journald prefixes, real or broken
ANSI colour codes (`\x1b[1;36m`, `[1;36m`, `ESC[1;36m`, `^[[1;36m`, `#033[1;36m`),
`Engine 001:` with data parallel, and `CPU KV cache` on CPU builds. Patterns are searched,
never anchored at the start of a line, so any prefix a log collector adds is fine.

Why it is fast: almost no line of a real serve.log says anything the monitor needs. Every
rule (an event, or a catalogue entry's signatures) has literals that a line it reads must
contain; one regex over all of them (sm120/logs/prefilter.py) runs over a whole block of text at
C speed, and only the lines it hits are cut out and given to the rules. An ordinary line
costs no Python code at all. `LogParser(prefilter=False)` runs every rule on every line
instead: the naive baseline of benchmarks/logparse_speed.py, which tests check gives the same
events.

vLLM colours only the process prefix, never the message text the literals come from, so the
prefilter and the event rules read lines as they are; failure lines are cleaned of colour
codes first, because catalogue signatures are written for clean lines and a person reads the
line the event carries.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TextIO

from sm120.core.bounded import is_regular_file
from sm120.core.errors import SM120Error
from sm120.logs import failures as failure_catalogue
from sm120.logs.events import (
    CudaGraphs,
    EngineInit,
    Event,
    Failure,
    IndexTopkSkip,
    KvBlocks,
    KvCache,
    KvMemory,
    MaxConcurrency,
    ModelLoaded,
    PrefixCache,
    Ready,
    SpecDecode,
    Stats,
)
from sm120.logs.prefilter import alternation, prefix_closure, rare_anchor, required_literal

# Real escape sequences, plus the two ways they reach a log once the ESC byte is lost or
# spelled out by a copy-paste ("[1;36m", "ESC[1;36m", "^[[1;36m").
# Engine lines are a few hundred characters; an endless one is read up to here (the rest of it
# is skipped), so one runaway print cannot cost the reader its length in memory.
MAX_LINE_CHARS = 1 << 20

_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|(?:\^\[|ESC|#033|\\033|\\x1b|\\e)?\[\d[\d;]*m"
)


# Every form above has "[" and a digit; checking for that first is much cheaper than the sub.
_ANSI_HINT = re.compile(r"\[[\d;]*m|\x1b")


def clean_line(line: str) -> str:
    """The line without colour codes (intact or broken) and without its line ending."""
    if _ANSI_HINT.search(line):
        line = _ANSI.sub("", line)
    return line.rstrip("\r\n")


# --- event rules: each reads one cleaned line ---------------------------------------------

Handler = Callable[["LogParser", str], list[Event]]

_NUMBER = r"(\d+(?:\.\d+)?)"
# "Name: 12.3" after the record start, a ", " or (2025-02 builds) "reqs " without a comma.
_STATS_FIELD = re.compile(r"(?:^|, |reqs )([A-Z][A-Za-z ]*): " + _NUMBER)
_ENGINE_BEFORE = re.compile(r"(?:Engine (\d+)|(\d+) Engines Aggregated): ?$")
_STATS_START = "Avg prompt throughput: "


def _stats(_parser: LogParser, line: str) -> list[Event]:
    start = line.find(_STATS_START)
    events: list[Event] = []
    while start >= 0:
        # A lost newline can glue two stats records into one line: read each of them.
        following = line.find(_STATS_START, start + 1)
        record = line[start:] if following < 0 else line[start:following]
        event = _stats_record(line[max(0, start - 40) : start], record)
        if event is not None:
            events.append(event)
        start = following
    return events


_STATS_FIELDS = {
    "Avg prompt throughput": "prompt_tps",
    "Avg generation throughput": "gen_tps",
    "Running": "running",
    "Waiting": "waiting",
    "Pending": "waiting",  # V0's name for it
    "Swapped": "swapped",
    "Preemptions": "preemptions",
    "Prefix cache hit rate": "prefix_hit_pct",
}
_FLOAT_FIELDS = frozenset(
    {"prompt_tps", "gen_tps", "kv_usage_pct", "cpu_kv_usage_pct", "prefix_hit_pct"}
)


# The V1 line as vLLM has printed it since 2025-02 without the optional fields: most real
# stats lines, read by one anchored match instead of the field-by-field loop below.
_STATS_COMMON = re.compile(
    r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
    r"Running: (\d+) reqs, Waiting: (\d+) reqs, \w+ KV cache usage: ([\d.]+)%"
    # Once there, the prefix hit rate must be read, not skipped (glued records fall through).
    r"(?:, Prefix cache hit rate: ([\d.]+)%|(?!, Prefix))(?:, |$)"
)


def _stats_record(before: str, record: str) -> Stats | None:
    engine = _ENGINE_BEFORE.search(before) if before else None
    number = int(engine[1] or engine[2]) if engine else None
    engine_index, engines = (number, None) if engine and engine[1] else (None, number)
    common = _STATS_COMMON.match(record)
    if common is None:
        return _stats_fields(record, engine_index, engines)
    prompt, gen, running, waiting, kv_usage, prefix_hit = common.groups()
    return Stats(
        engine=engine_index,
        engines=engines,
        prompt_tps=float(prompt),
        gen_tps=float(gen),
        running=int(running),
        waiting=int(waiting),
        kv_usage_pct=float(kv_usage),
        prefix_hit_pct=float(prefix_hit) if prefix_hit else None,
    )


def _stats_fields(record: str, engine: int | None, engines: int | None) -> Stats | None:
    """Any stats record, field by field: V0, optional V1 fields, whatever comes next."""
    values: dict[str, float | int] = {}
    for name, number in _STATS_FIELD.findall(record):
        field = _STATS_FIELDS.get(name)
        if field is None and name.endswith(" KV cache usage"):
            # V1 names the engine's own pool (GPU, or CPU on CPU builds); V0 follows the GPU
            # pool with its CPU swap space.
            field = "cpu_kv_usage_pct" if "kv_usage_pct" in values else "kv_usage_pct"
        if field is not None and field not in values:
            value = float(number)
            values[field] = value if field in _FLOAT_FIELDS else int(value)
    if "prompt_tps" not in values or "gen_tps" not in values:
        return None
    return Stats(engine=engine, engines=engines, **values)  # type: ignore[arg-type]


_MEAN_LENGTH = re.compile(r"Mean acceptance length: " + _NUMBER)
_DRAFT_RATE = re.compile(r"Draft acceptance rate: " + _NUMBER + "(%?)")
_ACCEPTED = re.compile(r"Accepted: (\d+) tokens|Number of accepted tokens: (\d+)")
_DRAFTED = re.compile(r"Drafted: (\d+) tokens|Number of draft tokens: (\d+)")
_ACCEPTED_TPS = re.compile(r"Accepted throughput: " + _NUMBER)
_DRAFTED_TPS = re.compile(r"Drafted throughput: " + _NUMBER)
_PER_POSITION = re.compile(r"Per-position acceptance rate: (\d[\d., ]*\d)")


def _spec_decode(_parser: LogParser, line: str) -> list[Event]:
    rate = _DRAFT_RATE.search(line)
    rate_pct = None
    if rate:
        # V1 prints a percentage; V0 (and V1 before 2025-04) a fraction.
        rate_pct = float(rate[1]) if rate[2] else round(float(rate[1]) * 100, 6)
    positions = _PER_POSITION.search(line)
    event = SpecDecode(
        mean_acceptance_length=_float(_MEAN_LENGTH, line),
        acceptance_rate_pct=rate_pct,
        accepted_tokens=_int_either(_ACCEPTED, line),
        drafted_tokens=_int_either(_DRAFTED, line),
        accepted_tps=_float(_ACCEPTED_TPS, line),
        drafted_tps=_float(_DRAFTED_TPS, line),
        per_position_rates=(
            tuple(float(part) for part in positions[1].split(", ")) if positions else None
        ),
    )
    return [event] if event.as_dict().keys() - {"kind"} else []


_KV_CACHE = re.compile(r"(\w+(?: \+ host)?) KV cache size: ([\d,]+) tokens")
_MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_KV_MEMORY = re.compile(r"Available KV cache memory: " + _NUMBER + " GiB")
_KV_BLOCKS = re.compile(r"(?:GPU|CUDA) blocks: (\d+)(?:, # CPU blocks: (\d+))?")
_MODEL_LOADED = re.compile(r"Model loading took " + _NUMBER + " GiB(?: memory)? and " + _NUMBER)
_MODEL_LOADED_V0 = re.compile(r"Loading model weights took " + _NUMBER + " GB")
_CUDA_GRAPHS = re.compile(
    r"Graph capturing finished in " + _NUMBER + r" secs?(?:, took ([\d.]+) GiB)?"
)
_ENGINE_INIT = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took "
    + _NUMBER
    + r" s(?:econds)?(?: \(compilation: ([\d.]+) s\))?"
)
_PREFIX_V0 = re.compile(r"Prefix cache hit rate: GPU: ([\d.]+)%, CPU: ([\d.]+)%")
_INDEX_SKIP = re.compile(r"index_topk_freq to skip sparse MLA indexer computation on layer (\d+)")


def _kv_cache(_parser: LogParser, line: str) -> list[Event]:
    found = _KV_CACHE.search(line)
    return [KvCache(tokens=_count(found[2]), device=found[1])] if found else []


def _max_concurrency(_parser: LogParser, line: str) -> list[Event]:
    found = _MAX_CONCURRENCY.search(line)
    if not found:
        return []
    return [MaxConcurrency(tokens_per_request=_count(found[1]), x=float(found[2]))]


def _kv_memory(_parser: LogParser, line: str) -> list[Event]:
    found = _KV_MEMORY.search(line)
    return [KvMemory(gib=float(found[1]))] if found else []


def _kv_blocks(_parser: LogParser, line: str) -> list[Event]:
    found = _KV_BLOCKS.search(line)
    if not found:
        return []
    return [KvBlocks(gpu_blocks=int(found[1]), cpu_blocks=int(found[2]) if found[2] else None)]


def _model_loaded(_parser: LogParser, line: str) -> list[Event]:
    found = _MODEL_LOADED.search(line)
    if found:
        return [ModelLoaded(gib=float(found[1]), seconds=float(found[2]))]
    found = _MODEL_LOADED_V0.search(line)
    return [ModelLoaded(gib=float(found[1]))] if found else []


def _cuda_graphs(_parser: LogParser, line: str) -> list[Event]:
    found = _CUDA_GRAPHS.search(line)
    if not found:
        return []
    return [CudaGraphs(seconds=float(found[1]), gib=float(found[2]) if found[2] else None)]


def _engine_init(_parser: LogParser, line: str) -> list[Event]:
    found = _ENGINE_INIT.search(line)
    if not found:
        return []
    compile_seconds = float(found[2]) if found[2] else None
    return [EngineInit(seconds=float(found[1]), compile_seconds=compile_seconds)]


def _prefix_v0(_parser: LogParser, line: str) -> list[Event]:
    found = _PREFIX_V0.search(line)
    if not found:
        return []
    return [PrefixCache(prefix_hit_pct=float(found[1]), cpu_prefix_hit_pct=float(found[2]))]


_READY = "Application startup complete."


def _ready(_parser: LogParser, line: str) -> list[Event]:
    return [Ready()] if _READY in line else []


def _index_skip(parser: LogParser, line: str) -> list[Event]:
    found = _INDEX_SKIP.search(line)
    if not found:
        return []
    parser.index_topk_skips += 1
    return [IndexTopkSkip(layer=int(found[1]), count=parser.index_topk_skips)]


@dataclass(frozen=True)
class Rule:
    """Every line `handler` can read something from holds at least one of `literals`.

    The literals are the prefilter's keys; a rule with none runs on every line.
    """

    literals: tuple[str, ...]
    handler: Handler


# Order is output order for events found in the same line.
EVENT_RULES: tuple[Rule, ...] = (
    Rule((_STATS_START,), _stats),
    Rule(("SpecDecoding metrics: ", "Speculative metrics: "), _spec_decode),
    Rule((" KV cache size: ",), _kv_cache),
    Rule(("Maximum concurrency for ",), _max_concurrency),
    Rule(("Available KV cache memory: ",), _kv_memory),
    Rule(("# GPU blocks: ", "# CUDA blocks: ", "# CPU blocks: "), _kv_blocks),
    Rule(("Model loading took ", "Loading model weights took "), _model_loaded),
    Rule(("Graph capturing finished in ",), _cuda_graphs),
    Rule(("(profile, create kv cache, warmup model) took ",), _engine_init),
    Rule(("Prefix cache hit rate: GPU: ",), _prefix_v0),
    Rule((_READY,), _ready),
    Rule(("index_topk_freq to skip sparse MLA indexer",), _index_skip),
)


def _failure_rule(failure_id: str, patterns: tuple[re.Pattern[str], ...]) -> Handler:
    """One event per catalogue entry and line, however many of its signatures match.

    Signatures are written for lines without colour codes (sm120/logs/failures.py), and the
    event carries the line as a person would read it.
    """

    def handler(_parser: LogParser, line: str) -> list[Event]:
        text = clean_line(line)
        if any(pattern.search(text) for pattern in patterns):
            return [Failure(id=failure_id, line=text)]
        return []

    return handler


@dataclass(frozen=True)
class _RuleSet:
    rules: tuple[Rule, ...]
    gate: re.Pattern[str] | None  # alternation of the rules' anchors
    by_anchor: dict[str, tuple[int, ...]]  # anchor found -> indexes of the rules to run
    unkeyed: tuple[int, ...]  # rules without a literal: run on every line


@lru_cache(maxsize=8)
def _rule_set(sm: int | None) -> _RuleSet:
    rules = list(EVENT_RULES)
    unkeyed: list[int] = []
    # Looked up at call time, so a test can hand in its own catalogue.
    for mode in failure_catalogue.load_catalogue().values():
        wrong_gpu = bool(mode.only_on_sm) and sm is not None and sm not in mode.only_on_sm
        if not mode.signatures or wrong_gpu:
            continue
        literals = [required_literal(signature) for signature in mode.signatures]
        if None in literals:
            unkeyed.append(len(rules))
        patterns = tuple(re.compile(signature) for signature in mode.signatures)
        keys = () if None in literals else tuple(str(literal) for literal in literals)
        rules.append(Rule(keys, _failure_rule(mode.id, patterns)))
    by_anchor: dict[str, list[int]] = {}
    for index, rule in enumerate(rules):
        for literal in rule.literals:
            anchor = rare_anchor(literal, _BY_FREQUENCY)
            by_anchor.setdefault(anchor, []).append(index)
    closure = prefix_closure(list(by_anchor))
    triggers = {
        anchor: tuple(sorted({index for other in closure[anchor] for index in by_anchor[other]}))
        for anchor in by_anchor
    }
    gate = alternation(list(by_anchor)) if by_anchor else None
    return _RuleSet(tuple(rules), gate, triggers, tuple(unkeyed))


# The prefilter's alternation is tried at every position holding the first character of one
# of its anchors, so anchors should start with a character that is rare where there is
# nothing to find: the characters of the corpus lines that hold no event
# (tests/data/vllm_logs/), most frequent first.
_BY_FREQUENCY = (
    " eroint1as0lp:dc_.m2ugh/35yv-49I=,Of['N]FP6(k)87bARTSECwMLGDW|U\"xz`BHK;Vq%j<{}Z?Q^Y>X+!*"
)


# --- the parser -------------------------------------------------------------------------------


class LogParser:
    """Feed it log text; it returns the events in order. Keeps the F09 skip-line count.

    `sm` (120, 121, 90, ...) drops catalogue entries limited to other GPUs; None keeps all.
    """

    def __init__(self, *, sm: int | None = None, prefilter: bool = True) -> None:
        self._set = _rule_set(sm)
        gate = self._set.gate
        # Without a literal for every rule there is nothing to skip lines on.
        usable = prefilter and not self._set.unkeyed and gate is not None
        self._search = gate.search if usable and gate is not None else None
        self.lines = 0
        self.index_topk_skips = 0

    def feed(self, line: str) -> list[Event]:
        """Events in one line (its line ending, if any, is ignored)."""
        self.lines += 1
        if self._search is None:
            return self._run(range(len(self._set.rules)), line)
        hit = self._search(line)
        if hit is None:
            return []
        return self._run(self._triggered(line, hit, len(line)), line)

    def feed_text(self, text: str) -> list[Event]:
        """Events in a block of complete lines (the fast path for files and pipes)."""
        if not text:
            return []
        self.lines += text.count("\n") + (0 if text.endswith("\n") else 1)
        if self._search is None:
            every_rule = range(len(self._set.rules))
            return [event for line in text.splitlines() for event in self._run(every_rule, line)]
        return self._scan(text)

    def parse_stream(self, stream: TextIO, block_chars: int = 1 << 20) -> Iterator[Event]:
        """Events from a text stream read in blocks; a partial last line is read at the end."""
        carry = ""
        skipping = False  # inside a line already cut at MAX_LINE_CHARS
        while True:
            block = stream.read(block_chars)
            if not block:
                break
            if skipping:
                end = block.find("\n")
                if end < 0:
                    continue
                block, skipping = block[end + 1 :], False
            block = carry + block
            cut = block.rfind("\n") + 1
            carry = block[cut:]
            yield from self.feed_text(block[:cut])
            if len(carry) > MAX_LINE_CHARS:
                # One endless line costs MAX_LINE_CHARS, not its length: read its start only.
                yield from self.feed_text(carry[:MAX_LINE_CHARS] + "\n")
                carry, skipping = "", True
        if carry:
            yield from self.feed_text(carry)

    def _scan(self, text: str) -> list[Event]:
        events: list[Event] = []
        search = self._search
        assert search is not None
        pos = 0
        while (hit := search(text, pos)) is not None:
            start = text.rfind("\n", 0, hit.start()) + 1
            end = text.find("\n", hit.end())
            if end < 0:
                end = len(text)
            events.extend(self._run(self._triggered(text, hit, end), text[start:end]))
            pos = end + 1
        return events

    def _triggered(self, text: str, hit: re.Match[str], end: int) -> list[int]:
        """Indexes (in rule order) of the rules whose anchors are in the line of `hit`.

        `hit` is the leftmost anchor of its line; the rest of the line (up to `end`) may hold
        more, possibly starting inside this one.
        """
        search = self._search
        assert search is not None
        by_anchor = self._set.by_anchor
        found = by_anchor[hit.group()]
        more = search(text, hit.start() + 1, end)
        while more is not None:
            found = found + by_anchor[more.group()]
            more = search(text, more.start() + 1, end)
        return sorted(set(found)) if len(found) > 1 else list(found)

    def _run(self, rules: Iterable[int], line: str) -> list[Event]:
        events: list[Event] = []
        for index in rules:
            events.extend(self._set.rules[index].handler(self, line))
        return events


class LogReadError(SM120Error):
    """The log to parse cannot be opened."""


def open_log(path: str) -> TextIO:
    """The log at `path` ("-" = stdin) as text; undecodable bytes become U+FFFD, not errors."""
    if path == "-":
        if hasattr(sys.stdin, "reconfigure"):
            sys.stdin.reconfigure(errors="replace")
        return sys.stdin
    where = Path(path)
    if where.exists() and not where.is_dir() and not is_regular_file(where):
        # A FIFO nobody writes to blocks at open, /dev/zero never ends: a pipe goes on stdin.
        raise LogReadError(
            f"{path} is not a regular file",
            hint="pipe a live log into '-' instead: docker logs -f NAME | sm120 logs parse -",
        )
    try:
        return open(path, encoding="utf-8", errors="replace")  # the caller closes it
    except OSError as exc:
        raise LogReadError(
            f"cannot read {path}: {exc.strerror or exc}",
            hint="pass the path of a log file, or - to read stdin",
        ) from None


def capped_text_lines(stream: TextIO) -> Iterator[str]:
    """Lines of a text stream as they come (a live pipe), each cut at MAX_LINE_CHARS."""
    while line := stream.readline(MAX_LINE_CHARS):
        if len(line) == MAX_LINE_CHARS and not line.endswith("\n"):
            while (rest := stream.readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
                pass  # the rest of a line already cut
        yield line


def at_most(lines: Iterable[str], max_chars: int, hint: str) -> Iterator[str]:
    """`lines` until they have carried `max_chars` characters: past that, LogReadError. A
    pipe of something that is not a log (`yes | ...`, /dev/urandom) then ends in one line
    instead of being read for ever."""
    read = 0
    for line in lines:
        read += len(line)
        if read > max_chars:
            raise LogReadError(f"stdin carried more than {max_chars >> 20:,} MiB", hint)
        yield line


def parse_lines(lines: Iterable[str], *, sm: int | None = None) -> Iterator[Event]:
    """Events from lines one at a time (the monitor's live tail)."""
    parser = LogParser(sm=sm)
    for line in lines:
        yield from parser.feed(line)


def parse_text(text: str, *, sm: int | None = None) -> list[Event]:
    return LogParser(sm=sm).feed_text(text)


def _count(text: str) -> int:
    return int(text.replace(",", ""))


def _float(pattern: re.Pattern[str], line: str) -> float | None:
    found = pattern.search(line)
    return float(found[1]) if found else None


def _int_either(pattern: re.Pattern[str], line: str) -> int | None:
    found = pattern.search(line)
    if not found:
        return None
    return int(found[1] or found[2])
