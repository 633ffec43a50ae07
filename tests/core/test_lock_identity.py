"""Whom a lock names: the process the kernel says holds it, never a pid a file claims.

Real processes: `flock(1)` stands in for any other program holding the lock file, and an
unrelated `sleep` is the process whose pid was written into it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.core.pidlock import PidLock, lock_holder, lock_is_held
from sm120.gateway.files import gateway_files
from tests.helpers import invoke, one_line_error, wait_for


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def _held_by_stranger(path: Path, named: int) -> subprocess.Popen[bytes]:
    """`flock` holds `path` while the file names `named`, another process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{named}\n")
    holder = subprocess.Popen(["flock", "--exclusive", str(path), "sleep", "300"])
    wait_for(lambda: lock_is_held(path))
    return holder


def test_our_own_lock_names_us(tmp_path: Path) -> None:
    with PidLock(tmp_path / "x.pid") as lock:
        assert lock.acquire()
        assert lock_holder(tmp_path / "x.pid") == os.getpid()
    assert lock_holder(tmp_path / "x.pid") is None


def test_a_pid_written_by_a_stranger_names_nobody(
    tmp_path: Path, victim: subprocess.Popen[bytes]
) -> None:
    path = tmp_path / "x.pid"
    holder = _held_by_stranger(path, victim.pid)
    try:
        assert lock_is_held(path)
        assert lock_holder(path) is None
    finally:
        holder.kill()
        holder.wait()


def test_a_fifo_as_lock_file_names_nobody_and_does_not_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "x.pid")
    started = time.monotonic()
    assert lock_holder(tmp_path / "x.pid") is None
    assert time.monotonic() - started < 2


def test_gateway_stop_never_signals_the_pid_in_a_strangers_lock(
    cli: CliRunner, isolated_home: Path, victim: subprocess.Popen[bytes]
) -> None:
    holder = _held_by_stranger(gateway_files().pid, victim.pid)
    try:
        assert invoke(cli, "gateway", "stop") == (0, "no gateway was running\n", "")
        time.sleep(0.2)
        assert victim.poll() is None, "gateway stop signalled the pid a file named"
        assert holder.poll() is None, "gateway stop signalled the lock's holder"
    finally:
        holder.kill()
        holder.wait()


def test_gateway_start_with_a_strangers_lock_is_an_error(
    cli: CliRunner, isolated_home: Path, victim: subprocess.Popen[bytes]
) -> None:
    files = gateway_files()
    holder = _held_by_stranger(files.pid, victim.pid)
    try:
        code, out, err = invoke(cli, "gateway", "start", "--port", "18931")
    finally:
        holder.kill()
        holder.wait()
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: another program holds the gateway's lock {files.pid}, and it is no gateway "
        f"(hint: find it with 'fuser -v {files.pid}', end it, then start the gateway again)",
    )
