"""The gateway's front (sm120.gateway.front) against a raw scripted engine: what takes the fast
path and what is handed to the application, kept-alive engine sockets, pipelining, a client
that goes away, an engine that closes or never answers, and the time bounds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from sm120.gateway import exchange, front, proxy
from sm120.gateway.front import Front, serving_front
from sm120.gateway.proxy import build_app
from sm120.gateway.swap import Swapper, SwapPolicy
from tests.fakes.gateway import GATEWAY_KEY, FakeActions, backend

EVENT = b'data: {"choices":[{"delta":{"content":"w"}}]}\n\n'
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


STREAM = STREAM_HEAD + chunk(EVENT) * 3 + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


@dataclass
class Engine:
    """A raw engine: answers each request with `answers` in turn (bytes, or a callable
    taking the writer), records each request and how many sockets it saw and lost."""

    answers: list[Any] = field(default_factory=list)
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    close_after_each: bool = False
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0) if self.answers else STREAM
                if callable(answer):
                    await answer(reader, writer)
                else:
                    writer.write(answer)
                    await writer.drain()
                if self.close_after_each:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.lost.set()
            writer.close()


@contextlib.asynccontextmanager
async def gateway(
    engine: Engine,
    url: str | None = None,
    rewrite: Any = None,
    access: Any = None,
    **fields: Any,
) -> AsyncIterator[Front]:
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.port = server.sockets[0].getsockname()[1]
    url = url or f"http://127.0.0.1:{engine.port}"
    table = {"sim": backend("sim", url, api_key="engine-key", **fields)}

    async def discover() -> dict[str, Any]:
        return dict(table)

    session = aiohttp.ClientSession(auto_decompress=False)
    swapper = Swapper(SwapPolicy(), FakeActions(table), discover)
    app = build_app(GATEWAY_KEY, swapper, session, rewrite=rewrite, access=access)
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


def request(body: dict[str, Any] | bytes, key: str = GATEWAY_KEY, extra: str = "") -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nx-api-key: {key}\r\n{extra}"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
    ).encode() + raw


CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def read_answers(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    """`count` whole answers off a kept-alive socket (each chunked, or with a length)."""
    answers = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        if b"chunked" in head.lower():
            body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
        else:
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
        answers.append(head + body)
    return answers


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_plain_stream_takes_the_fast_path_byte_for_byte_on_one_engine_socket() -> None:
    async def scenario() -> tuple[list[bytes], Engine, Front]:
        engine = Engine()
        async with gateway(engine) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT))
            first = await read_answers(reader, 1)
            # Two pipelined requests in one write: answered in order.
            writer.write(request(CHAT) + request({**CHAT, "n": 2}))
            rest = await read_answers(reader, 2)
            writer.close()
            return first + rest, engine, the_front

    answers, engine, the_front = run(scenario())
    assert answers == [STREAM] * 3
    assert (the_front.counts.answered, the_front.counts.handed_over) == (3, 0)
    assert engine.connections == 1  # kept alive and reused
    sent = engine.requests[0]
    assert b"Authorization: Bearer engine-key" in sent
    assert GATEWAY_KEY.encode() not in sent  # the gateway's key never reaches an engine
    assert json.loads(engine.requests[2].split(b"\r\n\r\n", 1)[1])["n"] == 2


@pytest.mark.parametrize(
    ("raw", "status", "handed_over"),
    [
        (request(CHAT, key="wrong"), 401, 1),
        (request({**CHAT, "model": "nope"}), 404, 1),
        (request(b"{not json"), 400, 1),
        (b"GET /health HTTP/1.1\r\nHost: g\r\n\r\n", 200, 1),
        # Malformed: the front's own parser answers it; nothing reaches the application.
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nX: a\nY: b\r\n\r\n", 400, 0),
    ],
)
def test_what_the_fast_path_does_not_take_the_application_answers(
    raw: bytes, status: int, handed_over: int
) -> None:
    async def scenario() -> tuple[bytes, Front]:
        async with gateway(Engine()) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(raw)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.close()
            return head, the_front

    head, the_front = run(scenario())
    assert head.split(b" ")[1] == b"%d" % status, head
    assert (the_front.counts.answered, the_front.counts.handed_over) == (0, handed_over)


def test_a_chunked_body_and_expect_continue_are_handed_over_and_served() -> None:
    body = json.dumps(CHAT).encode()
    chunked = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nx-api-key: %s\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%s0\r\n\r\n"
    ) % (GATEWAY_KEY.encode(), chunk(body))

    async def scenario() -> tuple[bytes, bytes, Front]:
        async with gateway(Engine()) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(chunked)
            first = (await read_answers(reader, 1))[0]
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT, extra="Expect: 100-continue\r\n").split(b"\r\n\r\n")[0])
            writer.write(b"\r\n\r\n")
            continued = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.write(body)
            await read_answers(reader, 1)
            writer.close()
            return first, continued, the_front

    first, continued, the_front = run(scenario())
    assert first.startswith(b"HTTP/1.1 200") and b"[DONE]" in first
    assert continued.startswith(b"HTTP/1.1 100")
    assert the_front.counts.handed_over == 2


def test_a_client_that_goes_away_mid_stream_closes_the_engines_socket() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD + chunk(EVENT))
        await writer.drain()
        await asyncio.wait_for(reader.read(), 10)  # b"" once the gateway lets go

    async def scenario() -> tuple[bool, Front]:
        engine = Engine(answers=[slow])
        async with gateway(engine) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT))
            await asyncio.wait_for(reader.readuntil(b"data: "), 5)
            writer.close()
            await asyncio.wait_for(engine.lost.wait(), 5)
            await asyncio.sleep(0.05)
            in_flight = sum(the_front.swapper.in_flight.values())
            return engine.lost.is_set() and in_flight == 0, the_front

    gone, _ = run(scenario())
    assert gone


def test_a_kept_alive_socket_the_engine_closed_is_replaced_without_the_client_noticing() -> None:
    async def scenario() -> tuple[list[bytes], Engine]:
        engine = Engine(close_after_each=True)  # like uvicorn dropping an idle socket
        async with gateway(engine) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            answers = []
            for _ in range(3):
                writer.write(request(CHAT))
                answers += await read_answers(reader, 1)
            writer.close()
            return answers, engine

    answers, engine = run(scenario())
    assert answers == [STREAM] * 3
    assert engine.connections == 3 and len(engine.requests) == 3  # none sent twice


def test_an_engine_that_dies_mid_answer_ends_the_clients_stream() -> None:
    async def dies(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD + chunk(EVENT))
        await writer.drain()
        writer.transport.abort()

    async def scenario() -> bytes:
        async with gateway(Engine(answers=[dies])) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT))
            return await asyncio.wait_for(reader.read(), 5)  # to EOF: the stream ended

    got = run(scenario())
    assert got.startswith(STREAM_HEAD) and got.endswith(chunk(EVENT))


def test_a_dead_engine_is_the_applications_502() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]

    async def scenario() -> bytes:
        async with gateway(Engine(), url=f"http://127.0.0.1:{dead}") as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT))
            return (await read_answers(reader, 1))[0]

    answer = run(scenario())
    assert answer.startswith(b"HTTP/1.1 502")


def test_an_engine_that_never_answers_is_502_after_the_read_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(exchange, "READ_TIMEOUT_S", 0.3)

    async def silent(_reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    async def scenario() -> bytes:
        async with gateway(Engine(answers=[silent])) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT))
            return (await read_answers(reader, 1))[0]

    answer = run(scenario())
    assert answer.startswith(b"HTTP/1.1 502")
    assert b"deployment dep-sim did not answer within 0 s" in answer


def test_a_body_not_sent_in_time_is_408_and_an_idle_connection_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(front, "BODY_READ_TIMEOUT_S", 0.3)
    monkeypatch.setattr(proxy, "IDLE_CONNECTION_S", 0.3)

    async def scenario() -> tuple[bytes, bytes, bytes]:
        async with gateway(Engine()) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT)[:-5])  # the body's last bytes never come
            late = await asyncio.wait_for(reader.read(), 5)
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            idle = await asyncio.wait_for(reader.read(), 5)  # closed, nothing said
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n")
            half_head = await asyncio.wait_for(reader.read(), 5)
            return late, idle, half_head

    late, idle, half_head = run(scenario())
    assert late.startswith(b"HTTP/1.1 408") and b"request body not received" in late
    assert idle == b"" and half_head == b""


def test_an_engines_route_miss_on_the_fast_path_is_501_and_its_own_404_passes_marked_final() -> (
    None
):
    miss = b'HTTP/1.1 404 Not Found\r\ncontent-length: 22\r\n\r\n{"detail":"Not Found"}'
    own = b'HTTP/1.1 404 Not Found\r\ncontent-length: 18\r\n\r\n{"error":"no such"}'[:-1]
    own = own.replace(b"18", b"%d" % len(b'{"error":"no such"'))

    async def scenario() -> list[bytes]:
        async with gateway(Engine(answers=[miss, own])) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT) + request(CHAT))
            answers = await read_answers(reader, 2)
            assert the_front.counts.handed_over == 0
            return answers

    miss_answer, own_answer = run(scenario())
    assert miss_answer.startswith(b"HTTP/1.1 501 Not Implemented\r\nx-should-retry: false\r\n")
    assert b"(its engine) does not serve /v1/chat/completions (chat)" in miss_answer
    # The engine's own 404 passes byte for byte, but for the line that ends a client's retries.
    assert own_answer == own.replace(b"Found\r\n", b"Found\r\nx-should-retry: false\r\n", 1)


@pytest.mark.parametrize(("status", "final"), [(400, True), (429, False), (503, False)])
def test_the_engines_answers_a_retry_cannot_change_say_so_on_the_fast_path(
    status: int, final: bool
) -> None:
    body = b'{"error":"x"}'
    answer = b"HTTP/1.1 %d Whatever\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body)

    async def scenario() -> bytes:
        async with gateway(Engine(answers=[answer])) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT))
            return (await read_answers(reader, 1))[0]

    got = run(scenario())
    assert (b"\r\nx-should-retry: false\r\n" in got) is final
    assert got.endswith(body)


def test_a_large_answer_to_a_slow_reader_arrives_whole() -> None:
    big = b"x" * (8 << 20)
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(big), big)

    async def scenario() -> bytes:
        async with gateway(Engine(answers=[answer])) as the_front:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", the_front.port, limit=1 << 16
            )
            writer.write(request(CHAT))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            got = bytearray()
            while len(got) < len(big):
                got += await asyncio.wait_for(reader.read(1 << 16), 5)
                await asyncio.sleep(0)  # a reader slower than the engine
            return head + bytes(got)

    assert run(scenario()) == answer


def test_a_fast_path_that_fails_hands_the_request_over_rather_than_dropping_it() -> None:
    def broken(_path: str, _body: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("a normaliser defect")

    async def scenario() -> tuple[bytes, Front]:
        async with gateway(Engine(), rewrite=broken) as the_front:
            # Read once, so the fast path routes from its table without a task.
            await the_front.routes.table(fresh=True)
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT))
            return (await read_answers(reader, 1))[0], the_front

    answer, the_front = run(scenario())
    assert answer.startswith(b"HTTP/1.1 500")  # the application's answer to the same defect
    assert the_front.counts.handed_over == 1
