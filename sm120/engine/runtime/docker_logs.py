"""Detached log capture for a container: `python -m sm120.engine.runtime.docker_logs ...`.

Docker keeps the container's output; this process copies it into the deployment's serve.log
as it is written, so `sm120 logs`, the launcher's phase tracking and the monitor read one file
whatever the runtime. It goes through the same rotating, exactly-once capture as a native
run's supervisor (sm120.engine.log_capture): serve.log rotates at 100 MB, and a re-attach - after
the restart policy restarted the container, or after this process itself was killed and
started again - neither loses nor repeats a line, because every line carries Docker's
timestamp and the capture's cursor remembers the last one written. When the container stops
for good it records how it ended.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sm120.engine import docker_api
from sm120.engine.log_capture import (
    DEFAULT_BACKUPS,
    DEFAULT_MAX_BYTES,
    Capture,
    LogChunk,
    RotatingLogWriter,
)
from sm120.engine.runtime.ward_keeper import WardKeeper
from sm120.engine.state import write_private_atomically

# How long an exited container gets to be restarted by its restart policy before the exit
# counts as final.
RESTART_GRACE_S = 3.0
CURSOR_NAME = "capture.json"  # beside serve.log
WARD_LOG = "ward.log"


def exit_record(container: Any) -> dict[str, Any]:
    state = container.attrs.get("State", {})
    code = state.get("ExitCode")
    record: dict[str, Any] = {"returncode": code, "signal": None, "ended_at": time.time()}
    # Docker reports a signal death as 128 + the signal number.
    if isinstance(code, int) and 128 < code < 128 + 65:
        record = {**record, "returncode": None, "signal": code - 128}
    if state.get("OOMKilled"):
        record["oom_killed"] = True
    return record


def stamp_key(stamp: str) -> str:
    """A timestamp that sorts as text in time order. Docker writes RFC 3339 with nanoseconds;
    padding the fraction to nine digits keeps the order even if trailing zeros are cut."""
    seconds, dot, rest = stamp.partition(".")
    if not dot:
        return seconds.rstrip("Z") + ".000000000Z"
    fraction = rest.rstrip("Z")
    return f"{seconds}.{fraction.ljust(9, '0')}Z"


def _since_seconds(stamp: str) -> int:
    """Whole UTC seconds of a Docker timestamp: where a replay can start (0 if unreadable)."""
    try:
        parsed = time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return 0
    return calendar.timegm(parsed)


class ContainerLogSource:
    """A container's log, as a replayable LogSource: positions are Docker timestamps.

    Identity is the container id, which a restart keeps, so one cursor spans restarts; the
    stream ends when the container stops."""

    def __init__(self, container: Any) -> None:
        self._container = container

    @property
    def identity(self) -> str:
        return str(self._container.id)

    def read(self, after: str | None) -> Iterator[LogChunk]:
        last = stamp_key(after) if after is not None else None
        since = _since_seconds(after) if after is not None else 0
        stream = self._container.logs(
            stream=True, follow=True, timestamps=True, since=since or None
        )
        pending = b""
        for piece in stream:
            pending += piece
            *lines, pending = pending.split(b"\n")
            chunk, last = _new_lines(lines, last)
            if chunk:
                yield LogChunk(chunk, last or "")
        if pending:
            # The container stopped mid-line: keep what it said, as a line of its own.
            chunk, last = _new_lines([pending], last)
            if chunk:
                yield LogChunk(chunk, last or "")


def _new_lines(lines: list[bytes], last: str | None) -> tuple[bytes, str | None]:
    """The lines stamped after `last`, without their stamps; and the newest stamp."""
    out = bytearray()
    for raw in lines:
        stamp, _, text = raw.partition(b" ")
        key = stamp_key(stamp.decode(errors="replace"))
        # A replay starts at a whole second: skip what is already written.
        if last is not None and key <= last:
            continue
        out += text + b"\n"
        last = key
    return bytes(out), last


class _Capturing:
    """The engine as the ward's keeper sees it: running while this capture runs."""

    def __init__(self) -> None:
        self.ended = False

    def poll(self) -> int | None:
        return 0 if self.ended else None


def capture(
    container_id: str,
    log_path: Path,
    exit_file: Path,
    max_bytes: int = DEFAULT_MAX_BYTES,
    backups: int = DEFAULT_BACKUPS,
    ward: list[str] | None = None,
) -> int:
    """Copy the container's output to log_path until it is gone. With `ward` (a warded
    engine, sm120.engine.ward): the ward that holds the deployment's port runs beside it, as
    long as the capture does; its own errors go to ward.log beside the log."""
    client = docker_api.connect()
    with RotatingLogWriter(log_path, max_bytes, backups) as writer:
        keeper = _start_ward(ward, writer, log_path.parent) if ward else None
        if ward and keeper is None:
            container = docker_api.get_container(client, container_id)
            if container is not None:
                container.stop(timeout=10)  # nothing could reach it
        capturing = _Capturing()
        if keeper is not None:
            keeper.watch(capturing)
        try:
            return _copy(client, container_id, writer, log_path, exit_file)
        finally:
            capturing.ended = True
            if keeper is not None:
                keeper.stop()


def _start_ward(command: list[str], writer: RotatingLogWriter, folder: Path) -> WardKeeper | None:
    def note(text: str) -> None:
        writer.end_torn_line()
        writer.write(text.encode() + b"\n")

    ward_log = os.open(folder / WARD_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    keeper = WardKeeper(command, note, ward_log)
    if keeper.start():
        return keeper
    keeper.stop()
    note("sm120: the engine's container is stopped (see ward.log)")
    return None


def _copy(
    client: Any, container_id: str, writer: RotatingLogWriter, log_path: Path, exit_file: Path
) -> int:
    from docker.errors import NotFound

    copier = Capture(writer, log_path.parent / CURSOR_NAME)
    while True:
        container = docker_api.get_container(client, container_id)
        if container is None:
            return 0  # removed: `sm120 stop` records the exit itself
        with contextlib.suppress(NotFound):  # removed while attaching: seen next round
            copier.pump(ContainerLogSource(container))
        if not _restarted_in_time(client, container_id):
            container = docker_api.get_container(client, container_id)
            if container is not None:
                write_private_atomically(exit_file, json.dumps(exit_record(container)) + "\n")
            return 0


def _restarted_in_time(client: Any, container_id: str) -> bool:
    deadline = time.monotonic() + RESTART_GRACE_S
    while time.monotonic() < deadline:
        container = docker_api.get_container(client, container_id)
        if container is None:
            return False
        if container.status in ("running", "restarting"):
            return True
        time.sleep(0.2)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--container", required=True)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--exit-file", required=True, type=Path)
    parser.add_argument("--ward-command", type=json.loads, default=None)
    args = parser.parse_args()
    # `sm120 stop` ends the capture with SIGTERM: its ward must end with it.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    return capture(args.container, args.log, args.exit_file, ward=args.ward_command)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    raise SystemExit(main())
