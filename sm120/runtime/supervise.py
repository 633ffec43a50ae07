"""Stay the engine's parent so that someone can record how it ended.

Usage: python -m sm120.runtime.supervise --exit-file FILE -- ARGV...

The launcher returns while the engine keeps running, so only a process that stays the
engine's parent can learn its exit status (a kill -9 of the engine included). This one
starts ARGV, forwards the SIGTERM/SIGINT/SIGHUP it receives, waits, writes
{"returncode", "signal", "ended_at"} atomically to FILE and exits with the child's code.

Standard library only: it starts in front of every engine and must start fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

USAGE = "usage: python -m sm120.runtime.supervise --exit-file FILE -- ARGV..."
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What a shell reports when a command cannot be found or run.
EXEC_FAILED = 127


def parse_args(args: list[str]) -> tuple[Path, list[str]]:
    if len(args) < 4 or args[0] != "--exit-file" or args[2] != "--":
        raise SystemExit(USAGE)
    return Path(args[1]), args[3:]


class SignalForwarder:
    """Pass termination signals on to the child, remembering any that arrive before it exists."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []

    def install(self) -> None:
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, self.handle)

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.child is None:
            self.pending.append(signum)
        elif self.child.returncode is None:
            self.child.send_signal(signum)

    def attach(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        for signum in self.pending:
            child.send_signal(signum)


def exit_record(returncode: int) -> dict[str, int | float | None]:
    # Popen reports death by signal N as returncode -N.
    if returncode < 0:
        return {"returncode": None, "signal": -returncode, "ended_at": time.time()}
    return {"returncode": returncode, "signal": None, "ended_at": time.time()}


def write_exit_file(path: Path, record: dict[str, int | float | None]) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    Path(tmp_name).replace(path)


def run(exit_file: Path, argv: list[str]) -> int:
    forwarder = SignalForwarder()
    forwarder.install()
    try:
        # Inherits stdin/stdout/stderr: the runtime already pointed them at the log file.
        child = subprocess.Popen(argv)
    except OSError as exc:
        print(f"sm120 supervise: cannot start {argv[0]}: {exc}", file=sys.stderr, flush=True)
        write_exit_file(exit_file, exit_record(EXEC_FAILED))
        return EXEC_FAILED
    forwarder.attach(child)
    returncode = child.wait()
    write_exit_file(exit_file, exit_record(returncode))
    # Shell convention for "killed by signal N"; re-raising the signal on ourselves is not
    # worth it, the exit file is the record.
    return 128 - returncode if returncode < 0 else returncode


def main() -> None:
    exit_file, argv = parse_args(sys.argv[1:])
    raise SystemExit(run(exit_file, argv))


if __name__ == "__main__":
    main()
