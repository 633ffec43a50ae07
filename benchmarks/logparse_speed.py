"""Log parser throughput on a large mixed real log, against the naive baseline, in one run.

The log is built from the real excerpts in tests/data/vllm_logs/: a startup block, then a
serving phase shaped like a real serve.log (mostly ordinary INFO and access lines, a stats
or spec-decoding line every `--every` lines, and a failure line every 50,000). The parser
runs pinned to one core. The naive baseline (every rule's regex on every line, no prefilter)
is timed on the first `--naive-lines` lines of the same log; both paths must give the same
events there, or the run fails.

Rates are given per CPU second of this process (what one core delivers, whatever else the
machine runs) and per wall-clock second (which includes waiting for a shared core). The
prefiltered parse runs `--repeat` times and the fastest run counts, as timeit does: on a
shared machine the slower runs measure the neighbours, not the parser.

Run: python benchmarks/logparse_speed.py [--lines 1000000] [--every 40] [--naive-lines 100000]
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import time
from pathlib import Path

from sm120.logs.events import Event
from sm120.logs.logparse import LogParser

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm_logs"
STARTUP = "v0.11.0rc2_compose_rocm_startup.log"


def corpus_lines() -> tuple[list[str], list[str], list[str]]:
    """(ordinary lines, stats/spec lines, failure lines) from every corpus file."""
    ordinary: list[str] = []
    periodic: list[str] = []
    failures: list[str] = []
    for path in sorted(CORPUS.glob("*.log")):
        for line in path.read_text(encoding="utf-8").splitlines():
            kinds = {event.kind for event in LogParser().feed(line)}
            if not kinds:
                ordinary.append(line)
            elif kinds <= {"stats", "spec_decode"}:
                periodic.append(line)
            elif kinds == {"failure"}:
                failures.append(line)
    return ordinary, periodic, failures


def build_log(total: int, every: int) -> str:
    ordinary, periodic, failures = corpus_lines()
    lines = (CORPUS / STARTUP).read_text(encoding="utf-8").splitlines()
    cycle_ordinary = itertools.cycle(ordinary)
    cycle_periodic = itertools.cycle(periodic)
    cycle_failures = itertools.cycle(failures)
    while len(lines) < total:
        position = len(lines)
        if position % 50_000 == 0:
            lines.append(next(cycle_failures))
        elif position % every == 0:
            lines.append(next(cycle_periodic))
        else:
            lines.append(next(cycle_ordinary))
    return "\n".join(lines[:total]) + "\n"


def timed(parser: LogParser, text: str) -> tuple[list[Event], float, float]:
    """The events, CPU seconds and wall seconds of parsing `text` as a stream."""
    cpu, wall = time.process_time(), time.perf_counter()
    events = list(parser.parse_stream(io.StringIO(text)))
    return events, time.process_time() - cpu, time.perf_counter() - wall


def pin_to_one_core() -> str:
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity here)"
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return f"pinned to core {core}"


def main() -> None:
    arguments = argparse.ArgumentParser(description=__doc__)
    arguments.add_argument("--lines", type=int, default=1_000_000)
    arguments.add_argument("--every", type=int, default=40, help="one stats/spec line per N")
    arguments.add_argument("--naive-lines", type=int, default=100_000)
    arguments.add_argument("--repeat", type=int, default=3)
    options = arguments.parse_args()
    pinning = pin_to_one_core()
    text = build_log(options.lines, options.every)
    size_mb = len(text.encode()) / 1e6

    runs = [timed(LogParser(), text) for _ in range(options.repeat)]
    events, fast_cpu, fast_wall = min(runs, key=lambda run: run[1])

    sample = text[: _nth_newline(text, options.naive_lines) + 1]
    naive_events, naive_cpu, naive_wall = timed(LogParser(prefilter=False), sample)
    if naive_events != timed(LogParser(), sample)[0]:
        raise SystemExit("the prefiltered parser and the naive baseline disagree on the sample")

    live = LogParser()
    cpu, wall = time.process_time(), time.perf_counter()
    for line in sample.splitlines():
        live.feed(line)
    feed_cpu, feed_wall = time.process_time() - cpu, time.perf_counter() - wall

    lines, sampled = options.lines, options.naive_lines
    print(f"log: {lines:,} lines, {size_mb:.0f} MB, {len(events):,} events; {pinning}")
    print(f"{'':26}{'lines/CPU-s':>14}{'lines/wall-s':>14}")
    _row("prefiltered, feed_text", lines, fast_cpu, fast_wall, f"best of {options.repeat}")
    _row("naive, every rule", sampled, naive_cpu, naive_wall, f"first {sampled:,} lines")
    _row("live tail, feed(line)", sampled, feed_cpu, feed_wall, f"first {sampled:,} lines")
    ratio = (lines / fast_cpu) / (sampled / naive_cpu)
    print(f"prefiltered / naive: {ratio:.1f}x per CPU second (goal: >= 500,000 lines/s)")


def _row(name: str, lines: int, cpu: float, wall: float, note: str) -> None:
    print(f"{name:26}{lines / cpu:14,.0f}{lines / wall:14,.0f}  ({note})")


def _nth_newline(text: str, count: int) -> int:
    position = -1
    for _ in range(count):
        position = text.find("\n", position + 1)
        if position < 0:
            return len(text) - 1
    return position


if __name__ == "__main__":
    main()
