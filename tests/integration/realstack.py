"""Helpers for tests that drive the real `sm120` command against a real vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sm120.engine.runtime.processes import group_members
from tests.helpers import port_is_free


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM120_")}
    env["SM120_HOME"] = str(home)
    env["NO_COLOR"] = "1"
    return env


def sm120(home: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sm120", *args],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_sm120(home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sm120", *args],
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def state_of(home: Path, name: str = "tiny") -> dict[str, Any] | None:
    path = home / "deployments" / name / "state.json"
    return json.loads(path.read_text()) if path.is_file() else None


def engine_processes(port: int) -> list[int]:
    """Processes whose command line serves on `port` (what must be gone after cleanup)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in args and str(port).encode() in args and any(b"vllm" in a for a in args):
            found.append(int(entry.name))
    return found


def wait_for(what: str, condition: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    """condition()'s first truthy value; an AssertionError naming `what` past the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def assert_nothing_left(home: Path, port: int, pgid: int | None) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and engine_processes(port):
        time.sleep(0.5)
    assert engine_processes(port) == []
    if pgid is not None:
        assert group_members(pgid) == []
    assert port_is_free(port)
    assert state_of(home) is None
