"""The gateway front against RFC 9112's MUSTs, with h11 as the oracle: every head h11 refuses
is refused by the front with the same status, answered (never a dropped connection or a
wait), the connection closed, and nothing of it reaching an engine or the application. Each
malformed case is a fast-path request that would be served 200 if the defect passed."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref

import h11
import pytest

from sm120.gateway import front
from tests.fakes.gateway import GATEWAY_KEY
from tests.gateway.test_gateway_front import CHAT, Engine, gateway, read_answers, request, run

BODY = json.dumps(CHAT).encode()
GOOD = request(CHAT)


def head_with(line: bytes = b"POST /v1/chat/completions HTTP/1.1", *extra: bytes,
              host: bytes | None = b"Host: g", length: bytes | None = None) -> bytes:  # fmt: skip
    """A fast-path request with its request line, Host or headers changed."""
    lines = [line] + ([host] if host is not None else [])
    lines += [b"x-api-key: " + GATEWAY_KEY.encode(), b"Content-Type: application/json"]
    lines += list(extra)
    lines.append(length if length is not None else b"Content-Length: %d" % len(BODY))
    return b"\r\n".join(lines) + b"\r\n\r\n" + BODY


MALFORMED = {
    "LF and a header in the target": head_with(
        b"POST /v1/chat/completions\nX-Injected:\t1 HTTP/1.1"
    ),
    "CR in the target": head_with(b"POST /v1/chat/completions\r HTTP/1.1"),
    "NUL in the target": head_with(b"POST /v1/chat\x00/completions HTTP/1.1"),
    "TAB in the target": head_with(b"POST /v1/chat\t/completions HTTP/1.1"),
    "DEL in the target": head_with(b"POST /v1/chat\x7f/completions HTTP/1.1"),
    "raw UTF-8 in the target": head_with("POST /v1/chat/completions?é HTTP/1.1".encode()),
    "NUL in a header value": head_with(b"POST /v1/chat/completions HTTP/1.1", b"X-A: a\x00b"),
    "NUL beside the key": GOOD.replace(b"x-api-key: ", b"x-api-key: \x00"),
    "vertical tab in a value": head_with(b"POST /v1/chat/completions HTTP/1.1", b"X-A: a\x0bb"),
    "form feed in a value": head_with(b"POST /v1/chat/completions HTTP/1.1", b"X-A: a\x0cb"),
    "space in a header name": head_with(b"POST /v1/chat/completions HTTP/1.1", b"X A: b"),
    "non-token byte in a name": head_with(b"POST /v1/chat/completions HTTP/1.1", b"X(A): b"),
    "space before the colon": head_with(b"POST /v1/chat/completions HTTP/1.1", b"X-A : b"),
    "no Host": head_with(host=None),
    "two Hosts": head_with(b"POST /v1/chat/completions HTTP/1.1", b"Host: h"),
    "gzip before chunked": GOOD.split(b"Content-Length")[0]
    + b"Transfer-Encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY),
    "HTTP/0.9": b"GET /health\r\n\r\n",
    "bare LF line ends": GOOD.replace(b"\r\n", b"\n"),
    "Content-Length in Arabic-Indic digits": head_with(length="Content-Length: ١٢".encode()),
    "two different lengths": head_with(b"POST /v1/chat/completions HTTP/1.1", b"Content-Length: 3"),
    "a length and chunked": head_with(
        b"POST /v1/chat/completions HTTP/1.1", b"Transfer-Encoding: chunked"
    ),
    "an obs-fold line": head_with(b"POST /v1/chat/completions HTTP/1.1", b"X-A: a", b" b"),
    "no space before the version": head_with(b"POST /v1/chat/completionsHTTP/1.1"),
}


# Where RFC 9112 lets a server either refuse or repair and h11 repairs, the front refuses
# (400): repairing is how a request means one thing to one parser and another to the next.
STRICTER_THAN_H11 = {
    "a length and chunked": "6.3: MAY reject; a request smuggling vector",
    "an obs-fold line": "5.2: MUST reject or replace each fold with spaces",
    "bare LF line ends": "2.2: MAY recognise a lone LF",
}


def h11_refusal(raw: bytes) -> int | None:
    """The status h11 would refuse `raw` with, or None where it takes a whole request."""
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(raw)
    try:
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA or isinstance(event, h11.EndOfMessage):
                return None
    except h11.RemoteProtocolError as error:
        return error.error_status_hint


async def send_raw(raw: bytes, engine: Engine) -> tuple[bytes, bytes, int]:
    """`raw` to the front: (its answer up to the close, within 5 s), what reached the engine."""
    async with gateway(engine) as the_front:
        reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
        writer.write(raw)
        answer = await asyncio.wait_for(reader.read(), 5)  # b"..." then the close
        writer.close()
        return answer, b"".join(engine.requests), the_front.counts.handed_over


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_what_h11_refuses_the_front_refuses_with_the_same_status_and_closes(case: str) -> None:
    raw = MALFORMED[case]
    expected = h11_refusal(raw)
    if case in STRICTER_THAN_H11:
        assert expected is None, "h11 refuses it now: move it out of STRICTER_THAN_H11"
        expected = 400
    assert expected is not None, "h11 takes this request: not a conformance case"
    answer, reached_engine, handed_over = run(send_raw(raw, Engine()))
    assert answer.startswith(b"HTTP/1.1 %d " % expected), answer[:80]
    assert b"Connection: close" in answer.split(b"\r\n\r\n")[0]
    assert reached_engine == b"" and handed_over == 0


def test_the_well_formed_base_request_is_one_h11_takes_and_the_fast_path_serves() -> None:
    assert h11_refusal(GOOD) is None

    async def scenario() -> bytes:
        async with gateway(Engine()) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(GOOD)
            answer = (await read_answers(reader, 1))[0]
            writer.close()
            return answer

    assert run(scenario()).startswith(b"HTTP/1.1 200")


def test_a_request_followed_by_a_half_close_is_answered_whole() -> None:
    async def scenario() -> list[bytes]:
        answers = []
        async with gateway(Engine()) as the_front:
            for _ in range(5):
                reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
                writer.write(GOOD)
                writer.write_eof()  # shut the sending side; keep reading
                answers.append(await asyncio.wait_for(reader.read(), 5))
                writer.close()
        return answers

    for answer in run(scenario()):
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"0\r\n\r\n")


def test_http_1_0_with_keep_alive_is_answered_for_1_0_and_closed_at_once() -> None:
    raw = b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    answer, _, handed_over = run(send_raw(raw, Engine()))
    assert answer.startswith(b"HTTP/1.0 200") and handed_over == 1
    assert b"chunked" not in answer.split(b"\r\n\r\n")[0].lower()


def test_a_declared_body_over_the_limit_is_413_before_it_is_sent() -> None:
    raw = head_with(length=b"Content-Length: %d" % (33 * 2**20)).split(b"\r\n\r\n")[0]
    answer, reached_engine, _ = run(send_raw(raw + b"\r\n\r\n" + b"x" * 100, Engine()))
    assert answer.startswith(b"HTTP/1.1 413") and reached_engine == b""
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["message"] == (
        "request body is larger than 32 MiB"
    )


def test_an_unterminated_head_past_64_kib_is_431_at_once() -> None:
    raw = b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nX-Pad: " + b"a" * (70 * 1024)
    answer, _, _ = run(send_raw(raw, Engine()))
    assert answer.startswith(b"HTTP/1.1 431")


def test_a_malformed_request_after_a_handed_over_one_is_still_refused() -> None:
    """Every request on a connection is parsed, not only its first (a handed-over connection
    used to be piped whole to the application's laxer parser)."""
    raw = b"GET /health HTTP/1.1\r\nHost: g\r\n\r\n" + MALFORMED["NUL in a header value"]
    answer, reached_engine, handed_over = run(send_raw(raw, Engine()))
    first, _, second = answer.partition(b"HTTP/1.1 400 ")
    assert first.startswith(b"HTTP/1.1 200") and second
    assert reached_engine == b"" and handed_over == 1


def test_after_a_handed_over_request_the_next_one_takes_the_fast_path_again() -> None:
    async def scenario() -> tuple[list[bytes], int, int]:
        async with gateway(Engine()) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(GOOD + b"GET /health HTTP/1.1\r\nHost: g\r\n\r\n" + GOOD)
            answers = await read_answers(reader, 3)
            writer.close()
            return answers, the_front.counts.answered, the_front.counts.handed_over

    answers, answered, handed_over = run(scenario())
    assert [answer.split(b" ")[1] for answer in answers] == [b"200"] * 3
    assert b"[DONE]" in answers[0] and b"[DONE]" in answers[2]
    assert (answered, handed_over) == (2, 1)


def test_connections_past_the_bound_are_refused_with_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front, "MAX_CONNECTIONS", 3)

    async def scenario() -> tuple[bytes, bytes]:
        async with gateway(Engine()) as the_front:
            held = [await asyncio.open_connection("127.0.0.1", the_front.port) for _ in range(3)]
            await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            refused = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            held[0][1].close()
            await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(GOOD)
            served = (await read_answers(reader, 1))[0]
            writer.close()
            for _, other in held[1:]:
                other.close()
            return refused, served

    refused, served = run(scenario())
    assert refused.startswith(b"HTTP/1.1 503") and b"too many open connections" in refused
    assert served.startswith(b"HTTP/1.1 200")


def test_a_closed_connections_parser_is_freed_at_once_not_at_the_next_gc() -> None:
    """The parser holds its reader's callbacks: unless the close breaks that cycle, a flood's
    heads stay in memory until a full garbage collection (61 -> 552 MB in the sweep)."""

    async def scenario() -> bool:
        async with gateway(Engine()) as the_front:
            _, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nX: " + b"a" * 4000)
            await asyncio.sleep(0.05)
            (connection,) = the_front.connections
            parser_reader = weakref.ref(connection.reader)
            del connection
            writer.close()
            await asyncio.sleep(0.1)
            return parser_reader() is None

    gc.disable()
    try:
        assert run(scenario())
    finally:
        gc.enable()


def test_an_answer_of_the_application_says_x_should_retry_once() -> None:
    """The application marks its own answers; the front, which marks an engine's, must not
    mark them again (two headers read as 'false, false' to the SDKs)."""
    answer, _, handed_over = run(send_raw(request(CHAT, key="wrong", extra="Connection: close\r\n"),
                                          Engine()))  # fmt: skip
    head = answer.split(b"\r\n\r\n")[0].lower()
    assert answer.startswith(b"HTTP/1.1 401") and handed_over == 1
    assert head.count(b"x-should-retry: false") == 1
