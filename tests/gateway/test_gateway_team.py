"""Keys per person, limits, fair turns and usage, on both of the gateway's paths (the front's
fast path against a raw scripted engine, as test_gateway_front.py drives it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from sm120.gateway.admission import Team
from sm120.gateway.config import TurnPolicy
from sm120.gateway.front import Front, serving_front
from sm120.gateway.keys import (
    RELOAD_CHECK_S,
    KeyEntry,
    KeyError_,
    KeyRing,
    KeyStore,
    add_key,
    check_expires,
    check_name,
    revoke_key,
    rotate_key,
)
from sm120.gateway.limits import Limits, Refusal, Turns
from sm120.gateway.proxy import build_app
from sm120.gateway.swap import Swapper, SwapPolicy
from sm120.gateway.usage import Record, UsageWriter, connect, read_usage, summary
from tests.fakes.gateway import GATEWAY_KEY, FakeActions, backend
from tests.gateway.test_gateway_front import CHAT, STREAM, Engine, read_answers

MESSAGES = {"model": "sim", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
JSON_ANSWER = (
    b'{"id":"x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":3,'
    b'"prompt_tokens_details":{"cached_tokens":8}}}'
)
JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


@contextlib.asynccontextmanager
async def gateway(engine: Engine, team: Team, **fields: Any) -> AsyncIterator[Front]:
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.port = server.sockets[0].getsockname()[1]
    table = {"sim": backend("sim", f"http://127.0.0.1:{engine.port}", **fields)}

    async def discover() -> dict[str, Any]:
        return dict(table)

    session = aiohttp.ClientSession(auto_decompress=False)
    swapper = Swapper(SwapPolicy(), FakeActions(table), discover)
    app = build_app(GATEWAY_KEY, swapper, session, team=team)
    internal = TestServer(app)
    await internal.start_server()
    assert internal.port is not None
    try:
        async with serving_front(
            app, GATEWAY_KEY, (internal.host, internal.port), "127.0.0.1", 0
        ) as the_front:
            yield the_front
    finally:
        await internal.close()
        await session.close()
        server.close()


def raw(path: str, body: dict[str, Any], auth: str) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: g\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def exchange(port: int, *requests: bytes) -> list[bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = []
    for one in requests:
        writer.write(one)
        answers += await read_answers(reader, 1)
    writer.close()
    return answers


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> Any:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def store_with(tmp_path: Path, *entries: KeyEntry) -> tuple[KeyStore, dict[str, str]]:
    store = KeyStore(tmp_path)
    return store, {entry.name: add_key(store, entry) for entry in entries}


def team_of(store: KeyStore, usage: UsageWriter | None = None) -> Team:
    return Team(KeyRing(GATEWAY_KEY, store), usage)


def bearer(key: str) -> str:
    return f"Authorization: Bearer {key}\r\n"


# --- one credential per request, on the fast path ---------------------------------------------
@pytest.mark.parametrize(
    "auth",
    [
        f"Authorization: Bearer {GATEWAY_KEY}\r\nAuthorization: Bearer wrong\r\n",
        f"Authorization: Bearer wrong\r\nx-api-key: {GATEWAY_KEY}\r\n",
        f"x-api-key: {GATEWAY_KEY}\r\nx-api-key: wrong\r\n",
    ],
)
def test_two_different_credentials_are_refused_on_the_fast_path(auth: str, tmp_path: Path) -> None:
    async def scenario() -> tuple[list[bytes], Engine, Front]:
        engine = Engine()
        async with gateway(engine, team_of(KeyStore(tmp_path))) as the_front:
            answers = await exchange(the_front.port, raw("/v1/chat/completions", CHAT, auth))
            return answers, engine, the_front

    (answer,), engine, the_front = asyncio.run(scenario())
    assert status_of(answer) == 401
    assert body_of(answer)["error"]["message"].startswith("two different credentials")
    assert engine.requests == []
    assert the_front.counts.handed_over == 1


def test_the_same_key_in_both_headers_is_one_credential(tmp_path: Path) -> None:
    auth = f"Authorization: Bearer {GATEWAY_KEY}\r\nx-api-key: {GATEWAY_KEY}\r\n"

    async def scenario() -> list[bytes]:
        async with gateway(Engine(), team_of(KeyStore(tmp_path))) as the_front:
            return await exchange(the_front.port, raw("/v1/chat/completions", CHAT, auth))

    assert asyncio.run(scenario()) == [STREAM]


# --- keys: models, revoke, rotate ---------------------------------------------------------------
def test_a_model_a_key_may_not_use_is_the_same_404_as_one_that_does_not_exist(
    tmp_path: Path,
) -> None:
    store, keys = store_with(tmp_path, KeyEntry("ann", "", models="other-*"))

    async def scenario() -> list[bytes]:
        async with gateway(Engine(), team_of(store)) as the_front:
            auth = bearer(keys["ann"])
            return await exchange(
                the_front.port,
                raw("/v1/chat/completions", CHAT, auth),
                raw("/v1/chat/completions", {**CHAT, "model": "other-x"}, auth),
            )

    forbidden, missing = asyncio.run(scenario())
    assert status_of(forbidden) == status_of(missing) == 404
    assert body_of(forbidden)["error"]["message"] == (
        "model 'sim' is not served here; models: none"
    )
    assert body_of(missing)["error"]["message"] == (
        "model 'other-x' is not served here; models: none"
    )


def test_revoke_and_rotate_act_on_a_running_gateway(tmp_path: Path) -> None:
    store, keys = store_with(tmp_path, KeyEntry("ann", ""), KeyEntry("bob", ""))

    async def scenario() -> list[int]:
        async with gateway(Engine(), team_of(store)) as the_front:
            chat = raw("/v1/chat/completions", CHAT, bearer(keys["ann"]))
            statuses = [status_of(a) for a in await exchange(the_front.port, chat)]
            revoke_key(store, "ann")
            new_bob = rotate_key(store, "bob")
            await asyncio.sleep(RELOAD_CHECK_S + 0.1)
            for key in (keys["ann"], keys["bob"], new_bob):
                answer = await exchange(
                    the_front.port, raw("/v1/chat/completions", CHAT, bearer(key))
                )
                statuses.append(status_of(answer[0]))
            return statuses

    assert asyncio.run(scenario()) == [200, 401, 401, 200]


def test_the_store_holds_digests_not_keys_in_private_files(tmp_path: Path) -> None:
    store, keys = store_with(tmp_path, KeyEntry("ann", "", rpm=3))
    text = store.path.read_text()
    assert keys["ann"] not in text and keys["ann"].startswith("sm120-")
    assert store.path.stat().st_mode & 0o777 == 0o600
    assert store.secret_path.stat().st_mode & 0o777 == 0o600
    ring = KeyRing(GATEWAY_KEY, store)
    found = ring.lookup(keys["ann"].encode())
    assert found is not None and (found.name, found.rpm) == ("ann", 3)
    admin = ring.lookup(GATEWAY_KEY.encode())
    assert admin is not None and admin.admin
    assert ring.lookup(b"sm120-guess") is None


def test_key_names_and_expiry_are_checked_with_a_hint() -> None:
    with pytest.raises(KeyError_) as bad:
        check_name("ann\x1b[2J")
    # The escape is shown as text, never sent to the terminal.
    assert bad.value.one_line() == (
        "'ann\\x1b[2J' is not a key name (hint: use letters, digits and . _ @ - (up to 64, "
        "starting with a letter or digit; 'admin' is the gateway's own key))"
    )
    with pytest.raises(KeyError_, match="is not a key name"):
        check_name("admin")
    with pytest.raises(KeyError_, match="--expires 2020-01-01 is in the past"):
        check_expires("2020-01-01")
    with pytest.raises(KeyError_, match="--expires 'soon' is not a date"):
        check_expires("soon")
    expired = KeyEntry("ann", "", expires="2020-01-01")
    assert expired.expired(time.time()) and not KeyEntry("b", "").expired(time.time())


# --- limits: 429 with Retry-After, in the protocol's own shape ---------------------------------
def test_a_key_over_its_requests_per_minute_gets_429_in_each_protocols_shape(
    tmp_path: Path,
) -> None:
    store, keys = store_with(tmp_path, KeyEntry("ann", "", rpm=1))
    messages_answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"

    async def scenario() -> list[bytes]:
        engine = Engine(answers=[STREAM, messages_answer])
        async with gateway(engine, team_of(store)) as the_front:
            auth = bearer(keys["ann"])
            return await exchange(
                the_front.port,
                raw("/v1/chat/completions", CHAT, auth),
                raw("/v1/chat/completions", CHAT, auth),
                raw("/v1/messages", MESSAGES, f"x-api-key: {keys['ann']}\r\n"),
            )

    first, openai_429, anthropic_429 = asyncio.run(scenario())
    assert status_of(first) == 200
    for answer in (openai_429, anthropic_429):
        assert status_of(answer) == 429
        retry = [line for line in answer.split(b"\r\n") if line.startswith(b"Retry-After:")]
        assert 1 <= int(retry[0].split(b":")[1]) <= 60
    assert body_of(openai_429)["error"]["type"] == "rate_limit_exceeded"
    assert body_of(openai_429)["error"]["message"] == "key 'ann' used its 1 requests per minute"
    assert body_of(anthropic_429)["type"] == "error"
    assert body_of(anthropic_429)["error"]["type"] == "rate_limit_error"


def test_a_stream_over_the_concurrency_limit_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    store, keys = store_with(tmp_path, KeyEntry("ann", "", concurrency=1))
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD_AND_ONE)
        await writer.drain()
        await release.wait()
        writer.write(STREAM_REST)
        await writer.drain()

    async def scenario() -> tuple[bytes, bytes]:
        engine = Engine(answers=[slow])
        async with gateway(engine, team_of(store)) as the_front:
            auth = bearer(keys["ann"])
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(raw("/v1/chat/completions", CHAT, auth))
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            (second,) = await exchange(the_front.port, raw("/v1/chat/completions", CHAT, auth))
            release.set()
            rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
            writer.close()
            return second, rest

    second, rest = asyncio.run(scenario())
    assert status_of(second) == 429
    assert body_of(second)["error"]["reason"] == "concurrency"
    assert rest.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # the first stream ran whole


STREAM_HEAD_AND_ONE = STREAM.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
STREAM_REST = STREAM.split(b"\r\n\r\n", 1)[1]


def test_limits_count_a_minute_and_say_when_to_retry() -> None:
    limits = Limits()
    entry = KeyEntry("ann", "", rpm=2, tpm=100)
    assert limits.admit(entry, now=0.0) is None
    assert limits.admit(entry, now=10.0) is None
    refusal = limits.admit(entry, now=20.0)
    assert refusal is not None and (refusal.reason, refusal.retry_after) == ("rpm", 40)
    assert limits.admit(entry, now=61.0) is None  # the first fell out of the window
    limits.spent("ann", 150, now=62.0)
    refusal = limits.admit(entry, now=75.0)
    assert refusal is not None and (refusal.reason, refusal.retry_after) == ("tpm", 47)


# --- fair turns ---------------------------------------------------------------------------
def test_turns_keep_a_share_for_other_keys_and_let_waiters_in_by_key() -> None:
    async def scenario() -> list[str]:
        # The round robin alone: a busy share of 3/4 is the reserve's (C - C // 4), no hold.
        turns = Turns(capacity=4, policy=TurnPolicy(busy_share=0.75, first_token_hold_s=0))
        order: list[str] = []
        assert turns.try_enter("bob", now=time.monotonic())  # bob has been here: two keys
        turns.leave("bob")
        for _ in range(3):
            assert turns.try_enter("flood")
        # The flood's fourth waits behind its own share; bob's request goes in at once.
        waiting = [asyncio.ensure_future(turns.enter("flood")) for _ in range(3)]
        await asyncio.sleep(0)
        assert turns.try_enter("bob")
        late_bob = asyncio.ensure_future(turns.enter("bob"))
        await asyncio.sleep(0)
        assert turns.total == 4 and turns.waiting_count() == 4

        async def note(task: asyncio.Future[bool], name: str) -> None:
            assert await task
            order.append(name)

        notes = [asyncio.ensure_future(note(t, "flood")) for t in waiting]
        notes.append(asyncio.ensure_future(note(late_bob, "bob")))
        turns.leave("bob")  # bob's slot: bob's next (the flood is at its share)
        await asyncio.sleep(0.01)
        turns.leave("flood")
        await asyncio.sleep(0.01)
        assert turns.held == {"bob": 1, "flood": 3}
        for key in ("flood", "flood", "bob"):
            turns.leave(key)
            await asyncio.sleep(0.01)
        for task in notes:
            task.cancel()
        return order

    assert asyncio.run(scenario()) == ["bob", "flood", "flood", "flood"]


def test_a_single_key_may_use_every_slot() -> None:
    turns = Turns(capacity=4)
    assert all(turns.try_enter("only") for _ in range(4))
    assert not turns.try_enter("only")


# --- usage ----------------------------------------------------------------------------------------
def test_usage_is_read_from_each_protocols_answer() -> None:
    cases = {
        "chat json": (JSON_HEAD % len(JSON_ANSWER) + JSON_ANSWER, b"", (11, 8, 3)),
        "anthropic stream": (
            b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
            b'{"input_tokens":20,"output_tokens":1}}}\n\n',
            b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":9,'
            b'"cache_read_input_tokens":16}}\n\n',
            (20, 16, 9),
        ),
        "responses stream": (
            b"",
            b'data: {"type":"response.completed","response":{"usage":{"input_tokens":5,'
            b'"output_tokens":2,"input_tokens_details":{"cached_tokens":0}}}}\n\n',
            (5, 0, 2),
        ),
        "no usage": (b"data: {}\n\n", b"data: [DONE]\n\n", (None, None, None)),
    }
    for name, (head, tail, expected) in cases.items():
        record = Record("k", "m", "chat", 200, 0.0, head=head, tail=tail)
        read_usage(record)
        found = (record.prompt_tokens, record.cached_tokens, record.completion_tokens)
        assert found == expected, name


def test_usage_is_recorded_in_sqlite_and_a_locked_database_never_fails_a_request(
    tmp_path: Path,
) -> None:
    store, keys = store_with(tmp_path, KeyEntry("ann", ""))
    path = tmp_path / "usage.db"
    writer = UsageWriter(path)
    writer.start()
    answer = JSON_HEAD % len(JSON_ANSWER) + JSON_ANSWER

    async def scenario() -> list[int]:
        engine = Engine(answers=[answer, answer])
        async with gateway(engine, team_of(store, writer)) as the_front:
            chat = raw("/v1/chat/completions", {**CHAT, "stream": False}, bearer(keys["ann"]))
            statuses = [status_of(a) for a in await exchange(the_front.port, chat)]
            await _until(lambda: writer.written == 1)
            locker = sqlite3.connect(path, isolation_level=None)
            locker.execute("BEGIN EXCLUSIVE")
            try:
                statuses += [status_of(a) for a in await exchange(the_front.port, chat)]
                await _until(lambda: writer.dropped == 1)
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            return statuses

    assert asyncio.run(scenario()) == [200, 200]
    writer.close()
    assert "locked" in writer.last_error
    rows = summary(path, "key", None)
    assert [(r["key"], r["requests"], r["prompt_tokens"], r["cached_tokens"]) for r in rows] == [
        ("ann", 1, 11, 8)
    ]
    # The database and SQLite's files beside it are the owner's alone.
    for name in ("usage.db", "usage.db-wal", "usage.db-shm"):
        side = path.with_name(name)
        assert not side.exists() or side.stat().st_mode & 0o777 == 0o600, name


def test_a_full_disk_drops_usage_and_counts_it(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes every write past the limit fail as a full disk does (EFBIG), in a
    child process so the test's own files are not limited."""
    script = f"""
import resource, signal, time
from pathlib import Path
from sm120.gateway.usage import Record, UsageWriter, connect
path = Path({str(tmp_path / "usage.db")!r})
connect(path, create=True).close()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
size = path.stat().st_size + 4096
resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
writer = UsageWriter(path)
writer.start()
for n in range(3000):
    writer.put(Record("k" * 200, "m" * 200, "chat", 200, time.monotonic()))
    if n % 500 == 0:
        time.sleep(0.05)
writer.close()
print(writer.written, writer.dropped, writer.last_error)
"""
    import sys

    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    written, dropped, error = done.stdout.split(" ", 2)
    assert int(dropped) > 0 and int(written) + int(dropped) == 3000
    assert "full" in error or "disk" in error or "I/O" in error, error


def test_old_rows_roll_up_into_days_and_totals_stay(tmp_path: Path) -> None:
    from sm120.gateway.usage import insert, roll_up

    path = tmp_path / "usage.db"
    db = connect(path, create=True)
    now = time.time()
    records = [
        Record(
            "ann",
            "m",
            "chat",
            200,
            0.0,
            at=now - 30 * 86400 + i,
            prompt_tokens=10,
            completion_tokens=2,
            ttft_ms=5.0,
        )
        for i in range(5)
    ] + [
        Record("ann", "m", "chat", 200, 0.0, at=now - 10 + i, prompt_tokens=1, completion_tokens=1)
        for i in range(4)
    ]
    insert(db, records)
    before = summary(path, "key", None)
    assert roll_up(db, now) == 5
    assert db.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 4
    assert summary(path, "key", None) == before
    assert before[0]["requests"] == 9 and before[0]["prompt_tokens"] == 54
    # Past max_rows, the oldest are folded even when young: half of max_rows stay (and one).
    assert roll_up(db, now, max_rows=2) == 2
    assert summary(path, "key", None) == before


def test_the_gateway_metrics_count_by_key_and_take_the_admin_key(tmp_path: Path) -> None:
    store, keys = store_with(tmp_path, KeyEntry("ann", ""))

    async def scenario() -> list[bytes]:
        async with gateway(Engine(), team_of(store)) as the_front:
            await exchange(the_front.port, raw("/v1/chat/completions", CHAT, bearer(keys["ann"])))
            get = "GET /metrics HTTP/1.1\r\nHost: g\r\n{}Content-Length: 0\r\n\r\n"
            return await exchange(
                the_front.port,
                get.format(bearer(GATEWAY_KEY)).encode(),
                get.format(bearer(keys["ann"])).encode(),
            )

    admin, other = asyncio.run(scenario())
    assert status_of(admin) == 200 and status_of(other) == 403
    text = admin.split(b"\r\n\r\n", 1)[1].decode()
    assert 'sm120_gateway_requests_total{key="ann",model="sim",status="200"} 1' in text


async def _until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_the_metrics_are_valid_prometheus_text_with_hostile_labels() -> None:
    from sm120.gateway.meter import Meter

    meter = Meter()
    meter.answered('ann"\\\n}', "tiny", 200)
    meter.refused("bob", "rpm")
    meter.waited("bob", 0.25)
    meter.tokens(Record("ann", "tiny", "chat", 200, 0.0, prompt_tokens=5, completion_tokens=2))
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=meter.render(), capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert 'key="ann\\"\\\\\\n}"' in meter.render()


def test_a_request_waits_for_its_turn_on_the_fast_path(
    tmp_path: Path,
) -> None:
    store, keys = store_with(tmp_path, KeyEntry("ann", ""))
    team = team_of(store)
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD_AND_ONE)
        await writer.drain()
        await release.wait()
        writer.write(STREAM_REST)
        await writer.drain()

    async def scenario() -> tuple[bytes, list[bytes], int, int]:
        engine = Engine(answers=[slow, STREAM])
        # One slot on the deployment: the second request waits for the first to end.
        async with gateway(engine, team, max_num_seqs=1) as the_front:
            chat = raw("/v1/chat/completions", CHAT, bearer(keys["ann"]))
            first_reader, first = await asyncio.open_connection("127.0.0.1", the_front.port)
            first.write(chat)
            await asyncio.wait_for(first_reader.readuntil(b"\r\n\r\n"), 5)
            waiting = asyncio.ensure_future(exchange(the_front.port, chat))
            await _until(lambda: team.turns.by_deployment["dep-sim"].waiting_count() == 1)
            assert len(engine.requests) == 1
            release.set()
            whole = await asyncio.wait_for(first_reader.readuntil(b"0\r\n\r\n"), 5)
            second = await asyncio.wait_for(waiting, 5)
            first.close()
            await _until(lambda: team.limits.uses["ann"].in_flight == 0)
            turns = team.turns.by_deployment["dep-sim"]
            return whole, second, turns.total, len(engine.requests)

    whole, second, held, sent = asyncio.run(scenario())
    assert whole.endswith(b"0\r\n\r\n") and second == [STREAM]
    assert (held, sent) == (0, 2)


def test_a_wait_for_a_turn_that_is_cancelled_leaves_no_count(tmp_path: Path) -> None:
    """A client gone while its request waits (the connection lost, or aiohttp cancelling the
    handler): out of its key's queue, its limits' counts taken back."""

    async def scenario() -> tuple[int, int, int]:
        team = team_of(KeyStore(tmp_path))
        entry = KeyEntry("ann", "", concurrency=5)
        holder = team.admit(entry, "dep", 1, "m", "chat")
        waiter = team.admit(entry, "dep", 1, "m", "chat")
        assert not isinstance(holder, Refusal) and not isinstance(waiter, Refusal)
        assert team.take_turn(holder) and not team.take_turn(waiter)
        waiting = asyncio.ensure_future(team.wait_turn(waiter))
        await asyncio.sleep(0.01)
        turns = team.turns.by_deployment["dep"]
        assert turns.waiting_count() == 1
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        return turns.waiting_count(), team.limits.uses["ann"].in_flight, turns.total

    assert asyncio.run(scenario()) == (0, 1, 1)  # only the holder is left


def test_a_stream_without_usage_still_counts_against_tokens_per_minute(tmp_path: Path) -> None:
    team = team_of(KeyStore(tmp_path))
    entry = KeyEntry("ann", "", tpm=5)
    ticket = team.admit(entry, "dep", None, "m", "chat")
    assert not isinstance(ticket, Refusal)
    ticket.tap.seen(STREAM.split(b"\r\n\r\n", 1)[1])  # three content events and [DONE]
    team.finish(ticket, 200)
    record = Record.of("ann", "m", "chat", 0.0, ticket.tap, 200)
    read_usage(record)
    assert record.completion_tokens is None  # nothing is written as if the engine said it
    team.recorded(record)
    assert team.limits.uses["ann"].token_sum == 2
