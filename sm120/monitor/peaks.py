"""peak.json and the sample history: small files that must survive anything.

peak.json is replaced atomically (write a temp file, fsync it, rename it over, fsync the
directory), so a reader - or the next monitor after a kill -9 mid-write - sees the old
record or the new one, never half of one. Peaks carry across server restarts and monitor
restarts; a different plan (plan hash or image) starts them over, since its numbers are not
comparable.

The history is a bounded ring of JSON lines in two files: once history.jsonl holds `cap`
samples it becomes history.1.jsonl (replacing the older one). Appends are O(1); a line
torn by a kill is skipped when read.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sm120.core.bounded import capped_lines

DEFAULT_HISTORY_CAP = 10_000
MAX_RECORD_BYTES = 64 * 1024


def write_json_atomically(path: Path, data: Any, *, durable: bool = True) -> None:
    """Replace `path` in one rename. `durable` also survives a power cut (fsyncs); a kill
    cannot tear the file either way."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        Path(tmp_name).replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp_name).unlink()
        raise
    if durable:
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # The rename itself is durable only once the directory entry is on disk.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing, torn, not text, or nested past the
    stack (the monitor's own files: written atomically, so any of these means damage)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError, RecursionError):
        return None


def iso_time(at: float) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    except (OverflowError, OSError, ValueError):  # a time no clock wrote: NaN, 1e300
        return "unknown time"


@dataclass
class Peaks:
    peak_prefill_tps: float = 0.0
    peak_decode_tps: float = 0.0
    peak_running: int = 0
    updated: str | None = None
    image: str | None = None
    plan_hash: str | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Peaks | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                peak_prefill_tps=float(data.get("peak_prefill_tps") or 0.0),
                peak_decode_tps=float(data.get("peak_decode_tps") or 0.0),
                peak_running=int(data.get("peak_running") or 0),
                updated=data.get("updated"),
                image=data.get("image"),
                plan_hash=data.get("plan_hash"),
            )
        except (TypeError, ValueError):
            return None


def load_peaks(path: Path) -> Peaks | None:
    return Peaks.from_dict(read_json(path))


class PeakTracker:
    """Keeps peak.json up to date; writes only when a peak rises."""

    def __init__(self, path: Path, *, image: str | None, plan_hash: str | None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        existing = load_peaks(path)
        same_plan = existing is not None and (existing.image, existing.plan_hash) == (
            image,
            plan_hash,
        )
        if same_plan and existing:
            self.peaks = existing
        else:
            # Written at once, so `cat logs/peak.json` works from the start.
            self.peaks = Peaks(image=image, plan_hash=plan_hash)
            write_json_atomically(path, asdict(self.peaks))

    def observe(
        self,
        *,
        prefill_tps: float | None,
        decode_tps: float | None,
        running: float | None,
        at: float,
    ) -> bool:
        """Fold in one interval's rates; True (and peak.json rewritten) if a peak rose."""
        peaks = self.peaks
        changed = False
        if prefill_tps is not None and prefill_tps > peaks.peak_prefill_tps:
            peaks.peak_prefill_tps, changed = round(prefill_tps, 2), True
        if decode_tps is not None and decode_tps > peaks.peak_decode_tps:
            peaks.peak_decode_tps, changed = round(decode_tps, 2), True
        if running is not None and int(running) > peaks.peak_running:
            peaks.peak_running, changed = int(running), True
        if changed:
            peaks.updated = iso_time(at)
            write_json_atomically(self.path, asdict(peaks))
        return changed


class JsonlRing:
    """Appends JSON objects; keeps between `cap` and 2 x `cap` of the newest."""

    def __init__(self, path: Path, cap: int = DEFAULT_HISTORY_CAP) -> None:
        if cap <= 0:
            raise ValueError("cap must be positive")
        self.path = path
        self.older = path.with_name(path.stem + ".1" + path.suffix)
        self.cap = cap
        path.parent.mkdir(parents=True, exist_ok=True)
        _end_torn_line(path)
        self._count = _line_count(path)

    def append(self, record: dict[str, Any]) -> None:
        if self._count >= self.cap:
            self.path.replace(self.older)
            self._count = 0
        line = json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        self._count += 1

    def read(self) -> Iterator[dict[str, Any]]:
        for path in (self.older, self.path):
            try:
                handle = path.open("rb")
            except FileNotFoundError:
                continue
            with handle:
                # A sample is a short JSON line: anything else (binary, torn, a runaway
                # line) is skipped, and costs at most MAX_RECORD_BYTES to skip.
                for line in capped_lines(handle, MAX_RECORD_BYTES):
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                        if isinstance(record, dict):
                            yield record


def _end_torn_line(path: Path) -> None:
    """A writer killed mid-append leaves half a line: end it, so the next sample is whole."""
    try:
        handle = path.open("rb+")
    except FileNotFoundError:
        return
    with handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) != b"\n":
            handle.write(b"\n")


def _line_count(path: Path) -> int:
    try:
        with path.open("rb") as handle:
            return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))
    except FileNotFoundError:
        return 0
