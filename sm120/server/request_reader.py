"""Every request a client sends the gateway, read by one strict HTTP/1.1 parser (llhttp, the
parser under uvicorn, through httptools) before anything is done with it: the fast path and
the application behind it only ever see a request that parsed whole, with RFC 9112's MUSTs
checked. What does not parse is answered here (400, 413, 431, 501, 505) and the connection
closed, so no malformed byte reaches an engine or the application's laxer parser.

Why a maintained parser: the hand-written head reader of the first fast path took control
bytes in the target, NUL in header values and HTTP/0.9 lines, and passed some of them on
(issue #49). llhttp refuses those by itself; what it allows and RFC 9112 does not (HTTP/0.9,
a missing or repeated Host, transfer codings other than chunked, raw bytes >= 0x80 in the
target) is refused below, with h11 as the oracle in the tests.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

import httptools

from sm120.server.framing import MAX_HEAD_BYTES, RequestHead

# The target: RFC 3986 characters only (printable ASCII, no space); llhttp lets bytes
# >= 0x80 through in its default mode.
_TARGET = re.compile(rb"[\x21-\x7e]+")


@dataclass(frozen=True)
class Request:
    """One whole request: its head, its body (de-chunked) and how the client frames the next."""

    head: RequestHead
    body: bytes
    version: str  # "1.0" or "1.1"
    keep_alive: bool
    expects_continue: bool


@dataclass(frozen=True)
class Refusal:
    """A request that cannot be served as sent: answered with `status`, then the connection
    is closed (its framing can no longer be trusted)."""

    status: int
    message: str


class RequestReader:
    """Feeds a connection's bytes to llhttp and keeps what came out, in order: whole requests,
    and at most one refusal, after which nothing more is read."""

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.out: deque[Request | Refusal] = deque()
        self.refused = False
        self._parser = httptools.HttpRequestParser(self)
        self._reset()
        # Body bytes held by requests read but not yet taken (for the front's memory bound).
        self.body_bytes = 0

    def _reset(self) -> None:
        self._url = bytearray()
        self._names: list[bytes] = []
        self._values: list[bytes] = []
        self._body: list[bytes] = []
        self._body_size = 0
        self._head_size = 0
        self._in_message = False
        self._headers_done = False
        self._expects_continue = False
        self._head: RequestHead | None = None

    @property
    def in_message(self) -> bool:
        """A request has begun and is not whole yet."""
        return self._in_message

    @property
    def in_body(self) -> bool:
        return self._in_message and self._headers_done

    @property
    def continue_wanted(self) -> bool:
        """The request now being read asked for `100 Continue` before it sends its body."""
        return self.in_body and self._expects_continue

    def feed(self, data: bytes) -> None:
        if self.refused:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # An Upgrade request (h2c, websocket): the gateway speaks HTTP/1.1 only and
            # ignores the offer, as a server may; llhttp reads nothing after it, so the
            # connection closes after its answer.
            last = self.out[-1] if self.out else None
            if isinstance(last, Request) and not self._in_message:
                self.out[-1] = Request(last.head, last.body, last.version, False,
                                       last.expects_continue)  # fmt: skip
                self.refused = True
            else:
                self._refuse(501, "protocol upgrades are not supported")
        except httptools.HttpParserCallbackError:
            pass  # a callback refused the request and said why
        except httptools.HttpParserError as error:
            self._refuse(400, f"malformed request: {error}")
        if self._in_message and not self._headers_done and not self.refused:
            self._head_size += len(data)
            if self._head_size > MAX_HEAD_BYTES:
                self._refuse(431, "request head too large")

    def close(self) -> None:
        """The connection is gone. The parser holds this reader's callbacks, a cycle the
        garbage collector would free only on its next full pass: broken here, so a closed
        connection's memory goes at once."""
        self.refused = True
        self._parser = None  # type: ignore[assignment]
        self.out.clear()
        self._reset()

    def eof(self) -> None:
        """The client sent its last byte: a request cut short is refused."""
        if self._in_message and not self.refused:
            self._refuse(400, "the request ended before it was whole")

    def take(self) -> Request | Refusal | None:
        if not self.out:
            return None
        item = self.out.popleft()
        if isinstance(item, Request):
            self.body_bytes -= len(item.body)
        return item

    def _refuse(self, status: int, message: str) -> None:
        self.refused = True
        self.out.append(Refusal(status, message))

    def _stop(self, status: int, message: str) -> None:
        """From a callback: refuse, and make llhttp stop reading."""
        self._refuse(status, message)
        raise _Refused

    # --- llhttp's callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._reset()
        self._in_message = True

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._names.append(name)
        self._values.append(value)

    def on_headers_complete(self) -> None:
        self._headers_done = True
        parser = self._parser
        version = parser.get_http_version()
        if version == "0.9":  # a request line with no version: RFC 9112 has none such
            self._stop(400, "malformed request line: no HTTP version")
        if version not in ("1.0", "1.1"):
            self._stop(505, f"HTTP/{version} is not supported: send HTTP/1.1")
        target = bytes(self._url)
        if not _TARGET.fullmatch(target) or not target.startswith(b"/"):
            self._stop(400, "malformed request target")
        names = [name.decode("latin-1").lower() for name in self._names]
        values = [value.decode("latin-1").strip(" \t") for value in self._values]
        head = RequestHead(parser.get_method().decode("ascii"), target.decode("ascii"),
                           tuple(zip(names, values, strict=True)))  # fmt: skip
        size = len(target) + sum(len(name) + len(value) + 4 for name, value in head.headers)
        if size > MAX_HEAD_BYTES:
            self._stop(431, "request head too large")
        self._check_head(head, version)
        self._head = head
        self._expects_continue = (head.header("expect") or "").lower() == "100-continue"

    def _check_head(self, head: RequestHead, version: str) -> None:
        hosts = sum(1 for name, _ in head.headers if name == "host")
        if hosts > 1 or (hosts == 0 and version == "1.1"):
            self._stop(400, "an HTTP/1.1 request carries exactly one Host header")
        codings = [value for name, value in head.headers if name == "transfer-encoding"]
        if codings and ",".join(codings).replace(" ", "").lower() != "chunked":
            self._stop(501, "only the chunked transfer coding is supported")
        expect = head.header("expect")
        if head.has("expect") and (expect or "").lower() != "100-continue":
            self._stop(417, "only Expect: 100-continue is supported")
        length = head.content_length
        if head.has("content-length") and length is None:
            self._stop(400, "malformed Content-Length")
        if length is not None and length > self.max_body_bytes:
            self._stop(413, f"request body is larger than {self.max_body_bytes // 2**20} MiB")

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self.max_body_bytes:
            self._stop(413, f"request body is larger than {self.max_body_bytes // 2**20} MiB")
        self._body.append(body)

    def on_message_complete(self) -> None:
        head = self._head
        assert head is not None
        body = b"".join(self._body)
        version = self._parser.get_http_version()
        # An HTTP/1.0 client gets one answer framed for 1.0, then the close: its keep-alive
        # would need answers the engines do not frame for it.
        keep_alive = self._parser.should_keep_alive() and version == "1.1"
        self.out.append(Request(head, body, version, keep_alive, self._expects_continue))
        self.body_bytes += len(body)
        self._reset()
        if not keep_alive:
            # Nothing after a request that closes the connection is read.
            self.refused = True
            raise _Refused


class _Refused(httptools.HttpParserCallbackError):
    """Raised from a callback to stop llhttp where the request was refused."""
