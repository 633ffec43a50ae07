"""The ward beside a warded engine (sm120.engine.ward), for the process that watches the
engine: the native runtime's supervisor, the Docker runtime's log capture.

Standard library only: the supervisor starts in front of every engine and must start fast.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Protocol

# The ward binds its port at once; a Python start on a loaded box can take seconds.
WARD_READY_TIMEOUT_S = 30.0
WARD_READY_LINE = b"ward listening on"
WARD_RESTARTS = 5
WARD_STOP_TIMEOUT_S = 5.0


class Watched(Protocol):
    """What the keeper watches: the engine (a Popen, or a container's stand-in)."""

    def poll(self) -> int | None: ...


class WardKeeper:
    """The ward beside the engine: started first, started again if it dies while the engine
    runs (WARD_RESTARTS times at most), stopped after it."""

    def __init__(
        self, command: list[str], note: Callable[[str], None], stderr_fd: int | None
    ) -> None:
        """`note` says a line in the deployment's log; `stderr_fd` (closed by stop) is where
        the ward's own errors go."""
        self.command = command
        self.note = note
        self.stderr_fd = stderr_fd
        self.process: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self._lock = threading.Lock()

    def start(self) -> bool:
        """Start the ward and wait until it holds the port; False (said in the log) if not."""
        try:
            process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=self.stderr_fd)
        except OSError as exc:
            self.note(f"sm120: cannot start the ward: {exc}")
            return False
        assert process.stdout is not None
        ready = select.select([process.stdout], [], [], WARD_READY_TIMEOUT_S)[0]
        line = process.stdout.readline() if ready else b""
        process.stdout.close()
        if not line.startswith(WARD_READY_LINE):
            with contextlib.suppress(OSError):
                process.kill()
            process.wait()
            self.note("sm120: the ward could not take the deployment's port")
            return False
        self.process = process
        return True

    def watch(self, engine: Watched) -> None:
        threading.Thread(target=self._keep, args=(engine,), daemon=True).start()

    def _keep(self, engine: Watched) -> None:
        for _ in range(WARD_RESTARTS):
            process = self.process
            if process is None:
                return
            code = process.wait()
            # A clean exit is a SIGTERM meant for it (`sm120 stop` signals the whole group).
            if code == 0 or self.stopping or engine.poll() is not None:
                return
            self.note(f"sm120: the ward ended ({code}); starting it again")
            time.sleep(1.0)
            with self._lock:
                if self.stopping or engine.poll() is not None or not self.start():
                    return

    def stop(self) -> None:
        with self._lock:
            self.stopping = True
            process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(WARD_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.stderr_fd is not None:
            os.close(self.stderr_fd)
            self.stderr_fd = None
