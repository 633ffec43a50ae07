"""`sm120 logs parse FILE`: typed events (throughput, KV cache, startup facts, known failures)
from any engine log, as readable lines or JSON."""

from __future__ import annotations

import typer

from sm120.cli.errors import cli_errors


def register(group: typer.Typer) -> None:
    group.command("parse")(parse)


@cli_errors
def parse(
    file: str = typer.Argument(..., metavar="FILE", help="A log file, or - to read stdin."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per event."),
) -> None:
    """Read events from an engine log: stats, spec decoding, startup facts, known failures."""
    import json
    import sys

    from sm120.logs.logparse import LogParser, capped_text_lines, open_log

    stream = open_log(file)
    parser = LogParser()
    piped = file == "-"
    # A pipe may be a live log (`docker logs -f ... | sm120 logs parse -`): read it line by
    # line and print each event as it comes; a file is read in large blocks, much faster.
    events = (
        (event for line in capped_text_lines(stream) for event in parser.feed(line))
        if piped
        else parser.parse_stream(stream)
    )
    count = 0
    try:
        for event in events:
            text = json.dumps(event.as_dict()) if as_json else event.describe()
            sys.stdout.write(text + "\n")
            if piped:
                sys.stdout.flush()
            count += 1
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()  # `... | head` closed the pipe: not an error
        return
    finally:
        if stream is not sys.stdin:
            stream.close()
    summary = f"{parser.lines:,} lines, {count:,} events"
    if parser.index_topk_skips:
        summary += f", {parser.index_topk_skips} index-topk skip lines (F09)"
    sys.stderr.write(summary + "\n")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
