"""sm120's own background processes (an engine's supervisor, the monitor, the gateway, a
cluster's log aggregator): started in a session of their own, so they outlive the command that
started them and a Ctrl-C at the terminal does not reach them, with their output appended to
a private log."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def start_detached(
    argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` with no stdin, stdout and stderr appended to `log` (created 0600), in
    `env` (else this process's environment)."""
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    finally:
        os.close(log_fd)
