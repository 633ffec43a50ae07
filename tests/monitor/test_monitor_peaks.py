"""peak.json: rises only, survives restarts and kill -9 mid-write; the bounded history."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sm120.monitor.peaks import JsonlRing, PeakTracker, load_peaks
from tests.helpers import REPO


def test_peaks_only_rise_and_are_written_when_they_do(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "peak.json"
    tracker = PeakTracker(path, image="img:1", plan_hash="abc")
    assert json.loads(path.read_text())["peak_decode_tps"] == 0.0  # there from the start
    assert tracker.observe(prefill_tps=100.0, decode_tps=10.0, running=1, at=0.0)
    assert not tracker.observe(prefill_tps=50.0, decode_tps=5.0, running=0, at=10.0)
    assert tracker.observe(prefill_tps=None, decode_tps=12.345, running=None, at=1_795_000_000.0)
    data = json.loads(path.read_text())
    assert data == {
        "peak_prefill_tps": 100.0,
        "peak_decode_tps": 12.35,
        "peak_running": 1,
        "updated": "2026-11-18T11:06:40Z",
        "image": "img:1",
        "plan_hash": "abc",
    }


def test_peaks_carry_across_a_restart_of_the_same_plan(tmp_path: Path) -> None:
    path = tmp_path / "peak.json"
    PeakTracker(path, image="img:1", plan_hash="abc").observe(
        prefill_tps=100.0, decode_tps=60.0, running=3, at=0.0
    )
    again = PeakTracker(path, image="img:1", plan_hash="abc")
    assert not again.observe(prefill_tps=90.0, decode_tps=59.0, running=2, at=1.0)
    assert again.peaks.peak_decode_tps == 60.0


def test_a_different_plan_starts_the_peaks_over(tmp_path: Path) -> None:
    path = tmp_path / "peak.json"
    PeakTracker(path, image="img:1", plan_hash="abc").observe(
        prefill_tps=100.0, decode_tps=60.0, running=3, at=0.0
    )
    other = PeakTracker(path, image="img:1", plan_hash="def")
    assert other.peaks.peak_decode_tps == 0.0
    assert other.observe(prefill_tps=1.0, decode_tps=2.0, running=1, at=1.0)
    peaks = load_peaks(path)
    assert peaks is not None and (peaks.plan_hash, peaks.peak_decode_tps) == ("def", 2.0)


WRITER = """
import sys
from pathlib import Path
from sm120.monitor.peaks import PeakTracker

tracker = PeakTracker(Path(sys.argv[1]), image="img", plan_hash="h")
start = tracker.peaks.peak_decode_tps
step = 0
while True:
    step += 1
    tracker.observe(prefill_tps=start + step, decode_tps=start + step, running=step, at=step)
"""


def test_peak_json_is_never_corrupt_when_the_writer_is_killed(tmp_path: Path) -> None:
    """A monitor that does nothing but rewrite peak.json, killed -9 twenty times at random
    moments: every time, the file parses, and peaks never go back."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    path = tmp_path / "peak.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    last = 0.0
    for kill in range(20):
        process = subprocess.Popen([sys.executable, str(script), str(path)], env=env)
        deadline = time.monotonic() + 30
        while not path.exists() or json.loads(path.read_text())["peak_decode_tps"] <= last:
            assert time.monotonic() < deadline, "the writer made no progress"
            time.sleep(0.005)
        time.sleep(0.01 * (kill % 5))
        process.send_signal(signal.SIGKILL)
        process.wait()
        text = path.read_text()
        data = json.loads(text)  # never half a file
        assert data["peak_decode_tps"] > last
        assert set(data) == {
            "peak_prefill_tps",
            "peak_decode_tps",
            "peak_running",
            "updated",
            "image",
            "plan_hash",
        }
        last = data["peak_decode_tps"]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".peak.json.")]
    # A kill between creating and renaming a temp file leaves at most that one behind.
    assert len(leftovers) <= 20


def test_history_ring_is_bounded(tmp_path: Path) -> None:
    ring = JsonlRing(tmp_path / "history.jsonl", cap=5)
    for index in range(12):
        ring.append({"t": index})
    assert [record["t"] for record in ring.read()] == list(range(5, 12))
    # A second ring object over the same files continues where the first stopped.
    again = JsonlRing(tmp_path / "history.jsonl", cap=5)
    again.append({"t": 12})
    assert [record["t"] for record in again.read()] == list(range(5, 13))


def test_history_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text('{"t": 1}\n{"t": 2, "dec')
    ring = JsonlRing(path, cap=100)
    ring.append({"t": 3})
    assert [record["t"] for record in ring.read()] == [1, 3]
