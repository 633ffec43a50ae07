"""serve.log capture: rotation between lines, exact resume, the supervisor's pipe, and a
follower that reads across rotations. Real files and real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sm120.engine.log_capture import (
    DEFAULT_MAX_BYTES,
    Capture,
    LogChunk,
    RotatingLogWriter,
    load_cursor,
    start_fresh_log,
)
from sm120.engine.log_follow import LogFollower, tail_lines
from tests.helpers import REPO


def all_lines(path: Path, backups: int = 9) -> list[bytes]:
    """Every line of serve.log and its backups, oldest first."""
    files = [path.with_name(f"{path.name}.{i}") for i in range(backups, 0, -1)] + [path]
    data = b"".join(f.read_bytes() for f in files if f.exists())
    return data.splitlines()


def test_rotation_happens_between_lines_and_keeps_the_newest(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with RotatingLogWriter(log, max_bytes=100, backups=2) as writer:
        for index in range(30):
            writer.write(f"line {index:02d} 123456789\n".encode())  # 18 bytes
    files = [log.with_name("serve.log.2"), log.with_name("serve.log.1"), log]
    assert all(f.stat().st_size <= 100 for f in files)
    assert not log.with_name("serve.log.3").exists()
    kept = all_lines(log, backups=2)
    # Each file holds 5 whole lines (90 bytes); 3 files kept of the 6 written.
    assert kept == [f"line {i:02d} 123456789".encode() for i in range(15, 30)]


def test_a_line_longer_than_a_file_gets_a_file_of_its_own(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with RotatingLogWriter(log, max_bytes=10, backups=3) as writer:
        writer.write(b"short\n")
        writer.write(b"x" * 25 + b"\n")
        writer.write(b"after\n")
    assert log.with_name("serve.log.2").read_bytes() == b"short\n"
    assert log.with_name("serve.log.1").read_bytes() == b"x" * 25 + b"\n"
    assert log.read_bytes() == b"after\n"


def test_a_chunk_of_many_lines_is_split_at_line_ends(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    chunk = b"".join(f"{i:04d}\n".encode() for i in range(100))  # 5 bytes a line
    with RotatingLogWriter(log, max_bytes=52, backups=20) as writer:
        writer.write(chunk)
    assert all_lines(log, backups=20) == [f"{i:04d}".encode() for i in range(100)]
    assert log.with_name("serve.log.1").read_bytes() == b"".join(
        f"{i:04d}\n".encode() for i in range(80, 90)
    )


def test_torn_last_line_is_ended_or_dropped(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_bytes(b"whole\nhalf a li")
    with RotatingLogWriter(log) as writer:
        assert writer.torn_tail()
        writer.end_torn_line()
        writer.write(b"next\n")
    assert log.read_bytes() == b"whole\nhalf a li\nnext\n"
    log.write_bytes(b"whole\nhalf a li")
    with RotatingLogWriter(log) as writer:
        writer.drop_torn_line()
        assert not writer.torn_tail()
        writer.write(b"next\n")
    assert log.read_bytes() == b"whole\nnext\n"


def test_lines_since_a_mark_counts_across_rotations(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with RotatingLogWriter(log, max_bytes=30, backups=5) as writer:
        writer.write(b"aaaa\nbbbb\n")
        device, inode, offset = writer.mark()
        assert writer.lines_since(device, inode, offset) == 0
        for index in range(9):
            writer.write(f"line{index}\n".encode())  # 6 bytes: rotates twice
        assert writer.lines_since(device, inode, offset) == 9


def test_start_fresh_log_moves_the_previous_run_aside(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "serve.log"
    start_fresh_log(log)  # nothing there yet: nothing to move
    assert log.exists() and not log.with_name("serve.log.1").exists()
    log.write_bytes(b"run 1\n")
    start_fresh_log(log)
    assert log.read_bytes() == b""
    assert log.with_name("serve.log.1").read_bytes() == b"run 1\n"


# --- exactly once across a re-attach ---------------------------------------------------------

CAPTURE_SCRIPT = """
import sys
import time
from pathlib import Path
from sm120.engine.log_capture import Capture, LogChunk, RotatingLogWriter

class NumberedSource:
    # A replayable source, like a container's log: lines 0..N-1, position = lines so far.
    identity = "numbers:run-1"
    def read(self, after):
        start = int(after) if after else 0
        for first in range(start, TOTAL, 7):
            last = min(first + 7, TOTAL)
            data = b"".join(b"line %06d\\n" % i for i in range(first, last))
            time.sleep(0.0005)  # a stream that takes a while, so it can be killed mid-way
            yield LogChunk(data, str(last))

TOTAL = int(sys.argv[2])
log = Path(sys.argv[1])
writer = RotatingLogWriter(log, max_bytes=40_000, backups=50)
interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.001
Capture(writer, log.with_name("capture.json"), save_interval_s=interval).pump(NumberedSource())
"""


def total_size(log: Path) -> int:
    """Bytes in the log and its backups; read again when a rotation renames a file between
    the listing and its stat."""
    while True:
        try:
            return sum(p.stat().st_size for p in log.parent.glob("serve.log*"))
        except FileNotFoundError:
            continue


def test_a_capture_killed_repeatedly_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    script = tmp_path / "capture.py"
    script.write_text(CAPTURE_SCRIPT)
    log = tmp_path / "serve.log"
    total = 24_000
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    kills = 0
    for _attempt in range(20):
        before = total_size(log)
        process = subprocess.Popen([sys.executable, str(script), str(log), str(total)], env=env)
        if kills < 8:
            # Kill once it has written ~1,500 more lines: a different spot in every run.
            deadline = time.monotonic() + 60
            while total_size(log) < before + 18_000 and process.poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                kills += 1
        process.wait(timeout=60)
        if process.returncode == 0:
            break
    assert kills == 8
    assert all_lines(log, backups=50) == [b"line %06d" % i for i in range(total)]
    cursor = load_cursor(log.with_name("capture.json"))
    assert cursor is not None and cursor.position == str(total)


def test_a_capture_killed_before_its_first_timed_save_resumes_exactly(tmp_path: Path) -> None:
    """The copier can write thousands of replayed lines within its first second; killed
    then, the next one must not copy the stream again from its start."""
    script = tmp_path / "capture.py"
    script.write_text(CAPTURE_SCRIPT)
    log = tmp_path / "serve.log"
    total = 6_000
    argv = [sys.executable, str(script), str(log), str(total)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen([*argv, "3600"], env=env)  # no timed save before the kill
    deadline = time.monotonic() + 60
    while total_size(log) < 24_000 and first.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=60) == -signal.SIGKILL
    assert 0 < len(all_lines(log, backups=50)) < total
    subprocess.run(argv, env=env, check=True, timeout=120)
    assert all_lines(log, backups=50) == [b"line %06d" % i for i in range(total)]


class ListSource:
    def __init__(self, identity: str, lines: list[bytes]) -> None:
        self.identity = identity
        self.lines = lines

    def read(self, after: str | None) -> Iterator[LogChunk]:
        start = int(after) if after else 0
        for index in range(start, len(self.lines)):
            yield LogChunk(self.lines[index] + b"\n", str(index + 1))


def test_a_new_stream_identity_starts_from_its_beginning(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    cursor = tmp_path / "capture.json"
    with RotatingLogWriter(log) as writer:
        capture = Capture(writer, cursor)
        assert capture.pump(ListSource("container:a", [b"a1", b"a2"])) == 2
        # Re-attach to the same container: nothing new, nothing repeated.
        assert capture.pump(ListSource("container:a", [b"a1", b"a2"])) == 0
        assert capture.pump(ListSource("container:a", [b"a1", b"a2", b"a3"])) == 1
        # A recreated container is a new stream: all of it is new.
        assert capture.pump(ListSource("container:b", [b"b1"])) == 1
    assert log.read_bytes().splitlines() == [b"a1", b"a2", b"a3", b"b1"]


# --- the supervisor's pipe -----------------------------------------------------------------

NUMBERED_WRITER = """
import sys
count, width = int(sys.argv[1]), int(sys.argv[2])
pad = "x" * (width - 12)
out = sys.stdout
for i in range(count):
    out.write(f"{i:010d} {pad}\\n")
out.write("no newline at the end")
"""


def supervise(tmp_path: Path, log: Path, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sm120.engine.runtime.supervise",
            "--exit-file",
            str(tmp_path / "exit.json"),
            "--log",
            str(log),
            "--",
            *argv,
        ],
        check=False,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_250_mb_through_the_supervisor_rotates_at_100_mb_and_loses_nothing(
    tmp_path: Path,
) -> None:
    writer_script = tmp_path / "writer.py"
    writer_script.write_text(NUMBERED_WRITER)
    log = tmp_path / "logs" / "serve.log"
    count, width = 2_500_000, 100  # 250 MB of 100-byte lines
    seen: list[int] = []
    done = threading.Event()

    def follow() -> None:
        # A live reader, as `sm120 logs -f` and the monitor are: it must cross both rotations.
        follower = LogFollower(log)
        total = 0
        while not done.is_set():
            total += len(follower.read_lines())
            time.sleep(0.01)
        total += len(follower.read_lines()) + len(follower.rest())
        seen.append(total)

    reader = threading.Thread(target=follow)
    reader.start()
    try:
        result = supervise(tmp_path, log, sys.executable, str(writer_script), str(count), "100")
    finally:
        done.set()
        reader.join()
    assert result.returncode == 0
    sizes = [log.with_name(f"serve.log.{i}").stat().st_size for i in (2, 1)]
    assert sizes == [DEFAULT_MAX_BYTES // width * width] * 2  # whole lines up to 100 MB each
    assert not log.with_name("serve.log.3").exists()
    numbers = 0
    expected = 0
    for path in (log.with_name("serve.log.2"), log.with_name("serve.log.1"), log):
        with path.open("rb") as handle:
            for line in handle:
                if expected < count:
                    assert line[:10] == b"%010d" % expected, f"line {expected} in {path.name}"
                    expected += 1
                else:
                    assert line == b"no newline at the end\n"
                numbers += 1
    assert expected == count
    assert numbers == count + 1
    assert seen == [count + 1]


def test_a_relaunched_process_appends_after_the_previous_run(tmp_path: Path) -> None:
    writer_script = tmp_path / "writer.py"
    writer_script.write_text(NUMBERED_WRITER)
    log = tmp_path / "serve.log"
    follower = LogFollower(log)
    supervise(tmp_path, log, sys.executable, str(writer_script), "1000", "40")
    first = follower.read_lines()
    supervise(tmp_path, log, sys.executable, str(writer_script), "500", "40")
    second = follower.read_lines()
    lines = log.read_bytes().splitlines()
    assert len(lines) == 1000 + 1 + 500 + 1
    assert lines[1000] == b"no newline at the end"
    assert lines[1001].startswith(b"0000000000 ")
    assert len(first) == 1001 and len(second) == 501


def test_supervisor_writes_why_it_could_not_start_into_the_log(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_bytes(b"an earlier run\n")
    result = supervise(tmp_path, log, str(tmp_path / "no-such-engine"))
    assert result.returncode == 127
    lines = log.read_text().splitlines()
    assert lines[0] == "an earlier run"
    assert lines[1].startswith("sm120 supervise: cannot start ")


# --- the reader side -----------------------------------------------------------------------


def test_follower_reads_across_several_rotations_between_reads(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with RotatingLogWriter(log, max_bytes=20, backups=9) as writer:
        writer.write(b"first\n")
        follower = LogFollower(log)
        assert follower.read_lines() == ["first"]
        for index in range(12):  # 8 bytes a line: rotates 5 times before the next read
            writer.write(f"line {index:02d}\n".encode())
        assert follower.read_lines() == [f"line {index:02d}" for index in range(12)]
        writer.write(b"tail\n")
        assert follower.read_lines() == ["tail"]


def test_follower_waits_for_the_file_and_hands_out_whole_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    follower = LogFollower(log)
    assert follower.read_lines() == []
    log.write_bytes(b"one\ntw")
    assert follower.read_lines() == ["one"]
    with log.open("ab") as handle:
        handle.write(b"o\r\n")
    assert follower.read_lines() == ["two"]


def test_tail_spans_the_rotation(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with RotatingLogWriter(log, max_bytes=12, backups=3) as writer:
        for index in range(5):
            writer.write(f"l{index}\n".encode())  # 3 bytes: 4 a file
    lines, in_current = tail_lines(log, 3)
    assert lines == ["l2", "l3", "l4"]
    assert in_current == 1


@pytest.mark.parametrize("bad", [(0, 1), (-5, 1), (10, -1)])
def test_writer_rejects_nonsense_limits(tmp_path: Path, bad: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="max_bytes must be positive"):
        RotatingLogWriter(tmp_path / "serve.log", max_bytes=bad[0], backups=bad[1])
