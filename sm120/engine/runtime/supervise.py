"""Stay the engine's parent so that someone can record how it ended.

Usage: python -m sm120.engine.runtime.supervise --exit-file FILE [--log LOG]
           [--ward-command JSON] -- ARGV...

The launcher returns while the engine keeps running, so only a process that stays the
engine's parent can learn its exit status (a kill -9 of the engine included). This one
starts ARGV, forwards the SIGTERM/SIGINT/SIGHUP it receives, waits, writes
{"returncode", "signal", "ended_at"} atomically to FILE and exits with the child's code.

With --log it also owns the engine's output: stdout and stderr come through a pipe and go
to LOG through sm120.engine.log_capture, rotated at 100 MB with a few backups kept. Being the
engine's parent, it sees every byte, and it drains the pipe before recording the exit, so
a reader that stops at the exit record has seen every line.

With --ward-command (a JSON list: sm120.engine.ward's command) it first starts the ward that
holds the deployment's port for an engine serving on a unix socket, waits until the ward says
it listens, then starts the engine; a ward that dies while the engine runs is started again,
and it is stopped once the engine has ended. The ward's errors go to LOG too.

Standard library only (capture is too): it starts in front of every engine and must start
fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from sm120.engine.log_capture import Capture, ProcessOutputSource, RotatingLogWriter
from sm120.engine.runtime.ward_keeper import WardKeeper

USAGE = (
    "usage: python -m sm120.engine.runtime.supervise --exit-file FILE [--log LOG] "
    "[--ward-command JSON] -- ARGV..."
)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What a shell reports when a command cannot be found or run.
EXEC_FAILED = 127
# After the engine exits, how long to keep reading output its leftover children still hold
# open. Its own last lines are already in the pipe: this only bounds waiting for orphans.
DRAIN_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Arguments:
    exit_file: Path
    log: Path | None
    argv: list[str]
    ward: list[str] | None = None


def parse_args(args: list[str]) -> Arguments:
    options: dict[str, str] = {}
    while args and args[0] in ("--exit-file", "--log", "--ward-command") and len(args) >= 2:
        options[args[0]] = args[1]
        args = args[2:]
    if "--exit-file" not in options or len(args) < 2 or args[0] != "--":
        raise SystemExit(USAGE)
    log = options.get("--log")
    ward = None
    if "--ward-command" in options:
        ward = json.loads(options["--ward-command"])
        if not isinstance(ward, list) or not ward or not all(isinstance(w, str) for w in ward):
            raise SystemExit(USAGE)
    return Arguments(Path(options["--exit-file"]), Path(log) if log else None, args[1:], ward)


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


class OutputPump:
    """Copies the engine's output pipe into the rotating log on a thread of its own."""

    def __init__(self, log: Path) -> None:
        self.writer = RotatingLogWriter(log)
        self.read_fd, self.write_fd = os.pipe()
        self._thread: threading.Thread | None = None

    def start(self, pid: int) -> None:
        os.close(self.write_fd)  # the child holds the only write end now
        source = ProcessOutputSource(self.read_fd, identity=f"process:{pid}")
        self._thread = threading.Thread(
            target=Capture(self.writer).pump, args=(source,), daemon=True
        )
        self._thread.start()

    def note(self, text: str) -> None:
        """A line of the supervisor's own, e.g. why the engine could not start."""
        self.writer.end_torn_line()
        self.writer.write(text.encode() + b"\n")

    def finish(self) -> None:
        if self._thread is not None:
            self._thread.join(DRAIN_TIMEOUT_S)


def run(
    exit_file: Path, argv: list[str], log: Path | None = None, ward: list[str] | None = None
) -> int:
    forwarder = SignalForwarder()
    forwarder.install()
    pump = OutputPump(log) if log is not None else None
    keeper = None
    if ward:
        # Its own copy of the log pipe's write end: the pump closes the first once the engine
        # holds it, and a ward started again later still writes its errors there.
        stderr = os.dup(pump.write_fd) if pump is not None else None
        keeper = WardKeeper(ward, pump.note if pump is not None else _print_note, stderr)
    if keeper is not None and not keeper.start():
        keeper.stop()
        if pump is not None:  # the ward's own error, still in the log's pipe
            pump.start(os.getpid())
            pump.finish()
        keeper.note("sm120 supervise: the engine was not started")
        write_exit_file(exit_file, exit_record(EXEC_FAILED))
        return EXEC_FAILED
    try:
        child = _start_child(argv, pump, warded=keeper is not None)
    except OSError as exc:
        message = f"sm120 supervise: cannot start {argv[0]}: {exc}"
        if pump is not None:
            pump.note(message)
        print(message, file=sys.stderr, flush=True)
        if keeper is not None:
            keeper.stop()
        write_exit_file(exit_file, exit_record(EXEC_FAILED))
        return EXEC_FAILED
    if pump is not None:
        pump.start(child.pid)
    forwarder.attach(child)
    if keeper is not None:
        keeper.watch(child)
    returncode = child.wait()
    if keeper is not None:
        keeper.stop()  # before the drain: the ward holds a write end of the log's pipe
    if pump is not None:
        pump.finish()
    write_exit_file(exit_file, exit_record(returncode))
    # Shell convention for "killed by signal N"; re-raising the signal on ourselves is not
    # worth it, the exit file is the record.
    return 128 - returncode if returncode < 0 else returncode


# A warded engine's files are this user's alone: its API socket (in a 0700 folder already)
# and the ZMQ IPC sockets vLLM makes in /tmp, which other users could otherwise open.
WARDED_UMASK = 0o077


def _start_child(
    argv: list[str], pump: OutputPump | None, *, warded: bool = False
) -> subprocess.Popen[bytes]:
    umask = WARDED_UMASK if warded else -1  # -1: the supervisor's own, as before
    if pump is None:
        # Inherits stdout/stderr: the caller pointed them somewhere.
        return subprocess.Popen(argv, umask=umask)
    return subprocess.Popen(argv, stdout=pump.write_fd, stderr=subprocess.STDOUT, umask=umask)


def _print_note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> None:
    args = parse_args(sys.argv[1:])
    raise SystemExit(run(args.exit_file, args.argv, args.log, args.ward))


if __name__ == "__main__":
    main()
