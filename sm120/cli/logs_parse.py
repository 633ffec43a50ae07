"""`sm120 logs parse FILE`: typed events (throughput, KV cache, startup facts, known failures)
from any engine log, as readable lines or JSON."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

import typer

from sm120.cli.errors import cli_errors


def register(group: typer.Typer) -> None:
    group.command("parse")(parse)


# What stdin may carry by default: ten of serve.log's 100 MiB rotations, more than a pipe of
# a real log brings in one sitting; past it the input is no log (or --max-mib says more).
# Read line by line at about 10 MiB/s, the bound is also a couple of minutes.
DEFAULT_STDIN_MIB = 1024


class _TimeUp(Exception):
    """--timeout passed while reading stdin."""


@cli_errors
def parse(
    file: str = typer.Argument(..., metavar="FILE", help="A log file, or - to read stdin."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per event."),
    max_mib: int = typer.Option(
        DEFAULT_STDIN_MIB,
        "--max-mib",
        help="With -: stop with an error once stdin has carried this many MiB.",
    ),
    timeout: float | None = typer.Option(
        None,
        "--timeout",
        help="With -: stop reading after this many seconds (a live log: how long to follow).",
    ),
) -> None:
    """Read events from an engine log: stats, spec decoding, startup facts, known failures.
    A file is read to its end; stdin until it ends, --timeout passes or --max-mib is read."""
    import json
    import sys

    from sm120.logs.logparse import LogParser, at_most, capped_text_lines, open_log

    stream = open_log(file)
    parser = LogParser()
    piped = file == "-"
    # A pipe may be a live log (`docker logs -f ... | sm120 logs parse -`): read it line by
    # line and print each event as it comes; a file is read in large blocks, much faster.
    hint = "raise --max-mib, or save the log to a file and parse that"
    events = (
        (
            event
            for line in at_most(capped_text_lines(stream), max_mib << 20, hint)
            for event in parser.feed(line)
        )
        if piped
        else parser.parse_stream(stream)
    )
    count = 0
    stopped = ""
    try:
        with _alarm(timeout if piped else None):
            for event in events:
                text = json.dumps(event.as_dict()) if as_json else event.describe()
                sys.stdout.write(text + "\n")
                if piped:
                    sys.stdout.flush()
                count += 1
        sys.stdout.flush()
    except _TimeUp:
        sys.stdout.flush()
        stopped = f" (stopped after {timeout:g} s: --timeout)"
    except BrokenPipeError:
        _silence_stdout()  # `... | head` closed the pipe: not an error
        return
    finally:
        if stream is not sys.stdin:
            stream.close()
    summary = f"{parser.lines:,} lines, {count:,} events{stopped}"
    if parser.index_topk_skips:
        summary += f", {parser.index_topk_skips} index-topk skip lines (F09)"
    sys.stderr.write(summary + "\n")


@contextlib.contextmanager
def _alarm(seconds: float | None) -> Iterator[None]:
    """Raise _TimeUp in this (the main) thread after `seconds`, even inside a blocked read
    of a silent pipe; None: no limit."""
    if seconds is None:
        yield
        return

    def time_up(_signum: int, _frame: object) -> None:
        raise _TimeUp

    previous = signal.signal(signal.SIGALRM, time_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
