"""Who used what: each request's key, model, protocol, status, tokens, TTFT and duration, in
SQLite under the gateway's folder.

The request path only watches the answer go by (`Tap`: its first and last few KiB, the time of
its first byte) and, once it is answered, puts one `Record` on a bounded queue. A thread of
its own parses the engine's usage out of those bytes and writes it: nothing on the request
path waits for the disk, a parse or a lock. A full disk, a locked database or a full queue
drop the record and count it (`dropped`), and the request is served all the same.

The database stays bounded: rows older than ROLL_UP_AFTER_S, or past MAX_ROWS, are rolled up
into one row per day, key, model, protocol and status.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120.gateway.requestlog import FORMAT_VERSION, RequestLog, structure

# What of an answer is kept to find its usage in: the head (Anthropic's message_start holds
# the prompt's tokens) and the tail (the last event, or a JSON body's end, holds the rest).
HEAD_BYTES = 4096
TAIL_BYTES = 8192
QUEUE_SIZE = 10_000
# How long a write waits for another writer (a `usage` reader never blocks WAL writers).
BUSY_TIMEOUT_MS = 200
MAX_ROWS = 200_000
ROLL_UP_AFTER_S = 14 * 86400
ROLL_UP_EVERY = 1000  # records
USAGE_KEYS = ("usage",)

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    protocol TEXT NOT NULL,
    status INTEGER NOT NULL,
    prompt_tokens INTEGER,
    cached_tokens INTEGER,
    completion_tokens INTEGER,
    ttft_ms REAL,
    duration_ms REAL
);
CREATE INDEX IF NOT EXISTS requests_at ON requests (at);
CREATE TABLE IF NOT EXISTS daily (
    day TEXT NOT NULL,
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    protocol TEXT NOT NULL,
    status INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    ttft_ms_sum REAL NOT NULL,
    ttft_count INTEGER NOT NULL,
    duration_ms_sum REAL NOT NULL,
    PRIMARY KEY (day, key, model, protocol, status)
);
"""


class Tap:
    """What the request path keeps of one answer as it passes: cheap per chunk."""

    __slots__ = ("events", "first_at", "head", "on_first", "status", "tail")

    def __init__(self) -> None:
        self.events = 0  # Server-Sent Events seen: a stream without usage is counted by them
        self.first_at = 0.0
        self.head = b""
        self.tail = bytearray()
        self.status = 0
        # Called once, as the first event passes (a stream's first token: first token first).
        self.on_first: Callable[[], None] | None = None

    def seen(self, data: bytes) -> None:
        if not self.first_at:
            self.first_at = time.monotonic()
        if len(self.head) < HEAD_BYTES:
            self.head += data[: HEAD_BYTES - len(self.head)]
        events = data.count(b"data: ")
        if events and not self.events and self.on_first is not None:
            self.on_first()
            self.on_first = None
        self.events += events
        tail = self.tail
        tail += data
        if len(tail) > 2 * TAIL_BYTES:
            del tail[:-TAIL_BYTES]


@dataclass
class Record:
    key: str
    model: str
    protocol: str
    status: int
    started: float  # time.monotonic() when the request was read
    at: float = field(default_factory=time.time)
    ttft_ms: float | None = None
    duration_ms: float | None = None
    events: int = 0
    head: bytes = b""
    tail: bytes = b""
    # The parsed request, for the opt-in request log only (its structure, not its text).
    body: dict[str, Any] | None = None
    # Filled in by the writer from head and tail.
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None

    @classmethod
    def of(
        cls, key: str, model: str, protocol: str, started: float, tap: Tap | None, status: int
    ) -> Record:
        now = time.monotonic()
        record = cls(key, model, protocol, status or (tap.status if tap else 0), started)
        record.duration_ms = (now - started) * 1000
        if tap is not None:
            if tap.first_at:
                record.ttft_ms = (tap.first_at - started) * 1000
            record.head, record.tail = tap.head, bytes(tap.tail[-TAIL_BYTES:])
            record.events = tap.events
        return record


def read_usage(record: Record) -> None:
    """The engine's usage, from the usage objects found in the answer's head and tail (every
    protocol's field names: OpenAI's, the Responses API's and Anthropic's)."""
    found: dict[str, int] = {}
    for part in (record.head, record.tail):
        for usage in _usage_objects(part):
            for name, value in _token_fields(usage):
                found[name] = max(found.get(name, 0), value)
    record.prompt_tokens = found.get("prompt")
    record.cached_tokens = found.get("cached")
    record.completion_tokens = found.get("completion")


def _usage_objects(data: bytes) -> Iterator[dict[str, Any]]:
    text = data.decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    at = 0
    for _ in range(8):  # a few per part: the head's and the tail's last events
        found = text.find('"usage"', at)
        if found < 0:
            return
        colon = text.find(":", found + 7)
        at = found + 7
        if colon < 0:
            return
        start = colon + 1
        while start < len(text) and text[start] in " \t\r\n":
            start += 1
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def _token_fields(usage: dict[str, Any]) -> Iterator[tuple[str, int]]:
    def number(value: object) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    for source, name in (
        ("prompt_tokens", "prompt"), ("input_tokens", "prompt"),
        ("completion_tokens", "completion"), ("output_tokens", "completion"),
        ("cache_read_input_tokens", "cached"),
    ):  # fmt: skip
        value = number(usage.get(source))
        if value is not None:
            yield name, value
    for details in ("prompt_tokens_details", "input_tokens_details"):
        inner = usage.get(details)
        if isinstance(inner, dict):
            value = number(inner.get("cached_tokens"))
            if value is not None:
                yield "cached", value


# --- the database ----------------------------------------------------------------------------
def connect(path: Path, *, create: bool) -> sqlite3.Connection:
    if create:
        # 0600 before the first byte: sqlite creates files with the umask's mode.
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
    uri = f"file:{path}?mode={'rwc' if create else 'ro'}"
    db = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    if create:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
        for suffix in ("-wal", "-shm"):
            side = path.with_name(path.name + suffix)
            if side.exists():
                side.chmod(0o600)
    return db


def insert(db: sqlite3.Connection, records: list[Record]) -> None:
    db.execute("BEGIN IMMEDIATE")
    try:
        db.executemany(
            "INSERT INTO requests (at, key, model, protocol, status, prompt_tokens, "
            "cached_tokens, completion_tokens, ttft_ms, duration_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    r.at,
                    r.key,
                    r.model,
                    r.protocol,
                    r.status,
                    r.prompt_tokens,
                    r.cached_tokens,
                    r.completion_tokens,
                    r.ttft_ms,
                    r.duration_ms,
                )
                for r in records
            ],
        )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def roll_up(db: sqlite3.Connection, now: float, max_rows: int = MAX_ROWS) -> int:
    """Fold old rows (and the oldest past `max_rows`) into per-day rows; how many were."""
    count = db.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
    edge = now - ROLL_UP_AFTER_S
    if count > max_rows:
        nth = db.execute(
            "SELECT at FROM requests ORDER BY at DESC LIMIT 1 OFFSET ?", (max_rows // 2,)
        ).fetchone()
        edge = max(edge, nth[0])
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(
            """
            INSERT INTO daily AS d SELECT
                date(at, 'unixepoch'), key, model, protocol, status, COUNT(*),
                COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(cached_tokens), 0),
                COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(ttft_ms), 0),
                COUNT(ttft_ms), COALESCE(SUM(duration_ms), 0)
            FROM requests WHERE at < ? GROUP BY 1, 2, 3, 4, 5
            ON CONFLICT (day, key, model, protocol, status) DO UPDATE SET
                requests = d.requests + excluded.requests,
                prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
                cached_tokens = d.cached_tokens + excluded.cached_tokens,
                completion_tokens = d.completion_tokens + excluded.completion_tokens,
                ttft_ms_sum = d.ttft_ms_sum + excluded.ttft_ms_sum,
                ttft_count = d.ttft_count + excluded.ttft_count,
                duration_ms_sum = d.duration_ms_sum + excluded.duration_ms_sum
            """,
            (edge,),
        )
        folded = db.execute("DELETE FROM requests WHERE at < ?", (edge,)).rowcount
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return int(folded)


class UsageWriter:
    """The background writer: records in, rows out, nothing ever raised to the request path."""

    def __init__(
        self,
        path: Path | None,
        on_record: Callable[[Record], None] | None = None,
        queue_size: int = QUEUE_SIZE,
        request_log: RequestLog | None = None,
    ) -> None:
        self.path = path
        self.request_log = request_log
        self.log_dropped = 0
        # Called from the writer thread with each parsed record (the callee hops threads).
        self.on_record = on_record
        self.dropped = 0
        self.written = 0
        self.last_error = ""
        self._queue: queue.Queue[Record | None] = queue.Queue(queue_size)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sm120-usage", daemon=True)
        self._thread.start()

    def put(self, record: Record) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        db = self._open()
        since_roll_up = 0
        while True:
            batch = [self._queue.get()]
            while len(batch) < 256:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            records = [r for r in batch if r is not None]
            for record in records:
                self._parse(record)
                self._log(record)
            if records and self.path is not None:
                db = db or self._open()
                since_roll_up += self._write(db, records)
            if db is not None and since_roll_up >= ROLL_UP_EVERY:
                since_roll_up = 0
                self._guarded(functools.partial(roll_up, db, time.time()))
            if done:
                if db is not None:
                    db.close()
                return

    def _parse(self, record: Record) -> None:
        # A parse never costs the record: its tokens stay unknown.
        with contextlib.suppress(Exception):
            read_usage(record)
        record.head = record.tail = b""
        if self.on_record is not None:
            self.on_record(record)

    def _log(self, record: Record) -> None:
        body, record.body = record.body, None
        if self.request_log is None or body is None:
            return
        try:
            row = {
                "v": FORMAT_VERSION, "at": round(record.at, 3), "key": record.key,
                "model": record.model, "protocol": record.protocol, "status": record.status,
                "prompt_tokens": record.prompt_tokens, "cached_tokens": record.cached_tokens,
                "completion_tokens": record.completion_tokens, "ttft_ms": record.ttft_ms,
                **structure(record.protocol, body),
            }  # fmt: skip
            self.request_log.write(row)
        except (OSError, ValueError, TypeError, RecursionError):
            self.log_dropped += 1

    def _open(self) -> sqlite3.Connection | None:
        if self.path is None:
            return None
        try:
            return connect(self.path, create=True)
        except (sqlite3.Error, OSError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None

    def _write(self, db: sqlite3.Connection | None, records: list[Record]) -> int:
        if db is None or not self._guarded(lambda: insert(db, records)):
            self.dropped += len(records)
            return 0
        self.written += len(records)
        return len(records)

    def _guarded(self, work: Callable[[], object]) -> bool:
        try:
            work()
            return True
        except (sqlite3.Error, OSError) as exc:  # locked, full, read-only, gone
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False


# --- reading it back ---------------------------------------------------------------------------
GROUPS = {"key": "key", "model": "model", "day": "day", "protocol": "protocol"}


def summary(path: Path, by: str, since: float | None) -> list[dict[str, Any]]:
    """Requests, tokens, errors and mean TTFT per `by`, raw rows and daily roll-ups together."""
    column = GROUPS[by]
    since_at = since or 0.0
    since_day = dt.datetime.fromtimestamp(since_at, dt.timezone.utc).date().isoformat()
    raw_group = "date(at, 'unixepoch')" if column == "day" else column
    query = f"""
        SELECT g, SUM(n), SUM(p), SUM(c), SUM(o), SUM(e), SUM(ts), SUM(tc) FROM (
            SELECT {raw_group} AS g, COUNT(*) AS n, COALESCE(SUM(prompt_tokens), 0) AS p,
                COALESCE(SUM(cached_tokens), 0) AS c, COALESCE(SUM(completion_tokens), 0) AS o,
                SUM(status >= 400) AS e, COALESCE(SUM(ttft_ms), 0) AS ts, COUNT(ttft_ms) AS tc
            FROM requests WHERE at >= ? GROUP BY g
            UNION ALL
            SELECT {column} AS g, SUM(requests), SUM(prompt_tokens), SUM(cached_tokens),
                SUM(completion_tokens), SUM(CASE WHEN status >= 400 THEN requests ELSE 0 END),
                SUM(ttft_ms_sum), SUM(ttft_count)
            FROM daily WHERE day >= ? GROUP BY g
        ) GROUP BY g ORDER BY g
    """  # the column comes from GROUPS, never from input
    db = connect(path, create=False)
    try:
        rows = db.execute(query, (since_at, since_day)).fetchall()
    finally:
        db.close()
    return [
        {
            by: g,
            "requests": n,
            "prompt_tokens": p,
            "cached_tokens": c,
            "completion_tokens": o,
            "errors": e,
            "mean_ttft_ms": round(ts / tc, 1) if tc else None,
        }
        for g, n, p, c, o, e, ts, tc in rows
    ]


def recent(path: Path, limit: int = 50) -> list[dict[str, Any]]:
    """The latest requests, newest first (the dashboard's list)."""
    db = connect(path, create=False)
    try:
        rows = db.execute(
            "SELECT at, key, model, protocol, status, prompt_tokens, cached_tokens, "
            "completion_tokens, ttft_ms, duration_ms FROM requests ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
    finally:
        db.close()
    names = (
        "at", "key", "model", "protocol", "status", "prompt_tokens", "cached_tokens",
        "completion_tokens", "ttft_ms", "duration_ms",
    )  # fmt: skip
    return [dict(zip(names, row, strict=True)) for row in rows]
