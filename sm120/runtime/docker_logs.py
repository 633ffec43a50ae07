"""Detached log capture for a container: `python -m sm120.runtime.docker_logs ...`.

Docker keeps the container's output; this process copies it into the deployment's serve.log
as it is written, so `sm120 logs`, the launcher's phase tracking and the monitor read one file
whatever the runtime. It re-attaches when the container restarts (restart policy) without
losing or repeating a line - Docker's fixed-width timestamps give a total order - and records
how the container ended when it stops for good.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, BinaryIO

from sm120 import docker_api
from sm120.state import write_private_atomically

# How long an exited container gets to be restarted by its restart policy before the exit
# counts as final.
RESTART_GRACE_S = 3.0


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


def _copy_stream(container: Any, since: str | None, out: BinaryIO) -> str | None:
    """Append new lines to out; return the timestamp of the last line written."""
    last = since
    pending = b""
    for chunk in container.logs(stream=True, follow=True, timestamps=True):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            stamp, _, text = raw.partition(b" ")
            stamp_text = stamp.decode(errors="replace")
            # On a re-attach Docker replays the whole log: skip what is already written.
            if last is not None and stamp_text <= last:
                continue
            out.write(text + b"\n")
            last = stamp_text
        out.flush()
    if pending:
        stamp, _, text = pending.partition(b" ")
        if last is None or stamp.decode(errors="replace") > last:
            out.write(text + b"\n")
            last = stamp.decode(errors="replace")
        out.flush()
    return last


def capture(container_id: str, log_path: Path, exit_file: Path) -> int:
    client = docker_api.connect()
    last: str | None = None
    with log_path.open("ab") as out:
        while True:
            container = docker_api.get_container(client, container_id)
            if container is None:
                return 0  # removed: `sm120 stop` records the exit itself
            last = _copy_stream(container, last, out)
            deadline = time.monotonic() + RESTART_GRACE_S
            while time.monotonic() < deadline:
                container = docker_api.get_container(client, container_id)
                if container is None:
                    return 0
                if container.status in ("running", "restarting"):
                    break
                time.sleep(0.2)
            else:
                write_private_atomically(exit_file, json.dumps(exit_record(container)) + "\n")
                return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--container", required=True)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--exit-file", required=True, type=Path)
    args = parser.parse_args()
    return capture(args.container, args.log, args.exit_file)


if __name__ == "__main__":
    raise SystemExit(main())
