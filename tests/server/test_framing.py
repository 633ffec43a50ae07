"""The fast path's HTTP/1.1 reading: request heads it takes or leaves to the application, and
where an answer ends however its bytes are split."""

from __future__ import annotations

import pytest

from sm120.server.framing import FramingError, ResponseFraming
from sm120.server.request_reader import Refusal, Request, RequestReader

HEAD = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nX-Api-Key: k"


def read(raw: bytes) -> Request | Refusal:
    reader = RequestReader(32 * 2**20)
    reader.feed(raw)
    item = reader.take()
    assert item is not None
    return item


def test_a_plain_request_is_read_with_lowercase_names() -> None:
    request = read(HEAD + b"\r\n\r\n" + b'{"model":""}')
    assert isinstance(request, Request)
    head = request.head
    assert (head.method, head.target, head.path) == ("POST", "/v1/chat/completions?x=1",
                                                     "/v1/chat/completions")  # fmt: skip
    assert head.header("x-api-key") == "k"
    assert head.content_length == 12
    assert (request.body, request.version, request.keep_alive) == (b'{"model":""}', "1.1", True)


def test_a_chunked_body_is_read_whole_and_pipelined_requests_in_order() -> None:
    reader = RequestReader(1024)
    reader.feed(b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}")
    assert reader.take() is None and reader.in_body
    reader.feed(b"\r\n0\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n")
    first, second = reader.take(), reader.take()
    assert isinstance(first, Request) and isinstance(second, Request)
    assert (first.body, second.head.target) == (b"{}", "/b")


@pytest.mark.parametrize(
    ("lengths", "refused"),
    [((b"12",), False), ((b"12", b"13"), True), ((b"-1",), True), ((b"1e3",), True)],
)
def test_content_length_is_taken_only_when_unambiguous(
    lengths: tuple[bytes, ...], refused: bool
) -> None:
    raw = b"POST / HTTP/1.1\r\nHost: a" + b"".join(b"\r\nContent-Length: " + n for n in lengths)
    item = read(raw + b"\r\n\r\n" + b"x" * 12)
    assert isinstance(item, Refusal) == refused
    if refused:
        assert isinstance(item, Refusal) and item.status == 400


ANSWERS = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    "chunked": (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n7\r\ndata: a\r\n10;ext=1\r\ndata: [DONE]\n\n\r\n\r\n0\r\nTrailer: x\r\n\r\n"
    ),
    "empty": b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_an_answer_ends_where_it_ends_at_every_split(name: str) -> None:
    answer = ANSWERS[name]
    next_answer = b"HTTP/1.1 200 OK\r\n"
    for cut in range(1, len(answer)):
        framing = ResponseFraming()
        used = framing.feed(answer[:cut])
        assert used == cut and not framing.done, cut
        assert framing.feed(answer[cut:] + next_answer) == len(answer) - cut
        assert framing.done and framing.status == 200 and framing.keep_alive


def test_an_answer_without_framing_runs_until_close_and_is_not_reused() -> None:
    framing = ResponseFraming()
    framing.feed(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nsome")
    assert not framing.done and not framing.keep_alive
    assert framing.feed(b" more") == 5
    assert framing.closed()


def test_a_chunked_answer_cut_short_is_not_whole() -> None:
    framing = ResponseFraming()
    framing.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
    assert not framing.closed()


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n",
    ],
)
def test_framing_it_cannot_follow_is_an_error(answer: bytes) -> None:
    with pytest.raises(FramingError):
        ResponseFraming().feed(answer)


def test_connection_close_and_http_1_0_are_not_kept_alive() -> None:
    for head in (b"HTTP/1.1 200 OK\r\nConnection: close", b"HTTP/1.0 200 OK"):
        framing = ResponseFraming()
        framing.feed(head + b"\r\nContent-Length: 0\r\n\r\n")
        assert framing.done and not framing.keep_alive
