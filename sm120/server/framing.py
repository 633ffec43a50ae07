"""HTTP/1.1 on the wire, as the gateway's front reads it: a request head as parsed (by
sm120.server.request_reader), and where an answer ends in a stream of bytes passed on untouched
(Content-Length, chunked, or the close of the connection)."""

from __future__ import annotations

from dataclasses import dataclass

HEAD_END = b"\r\n\r\n"
# A head longer than this is no agent's request: the full server answers it (431 or 400).
MAX_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    # Lower-cased names, in the order sent; values as sent (latin-1, stripped).
    headers: tuple[tuple[str, str], ...]

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> str | None:
        """The value of a header sent once; None when absent or sent more than once."""
        values = [value for key, value in self.headers if key == name]
        return values[0] if len(values) == 1 else None

    def has(self, name: str) -> bool:
        return any(key == name for key, _ in self.headers)

    @property
    def content_length(self) -> int | None:
        text = self.header("content-length")
        if text is None or not text.isdigit() or len(text) > 12:
            return None
        return int(text)


class FramingError(ValueError):
    """An answer whose framing cannot be followed: the connection cannot be used again."""


class ResponseFraming:
    """Follows one answer's bytes to its end without copying them anywhere: `feed` takes what
    arrived and says how many of those bytes belong to this answer. The head is kept (to read
    the status and framing headers); the body is only counted."""

    def __init__(self, *, no_body: bool = False) -> None:
        # `no_body`: the answer to a HEAD request, whose framing headers describe a body
        # that is not sent.
        self._no_body = no_body
        self._head = bytearray()
        self.status = 0
        self.keep_alive = True
        self.done = False
        self.head_bytes = 0  # the length of the answer's head, blank line included
        self.chunked = False
        # "head", "length", "size" (a chunk-size line), "data", "trailer", "close"
        self._state = "head"
        self._left = 0
        self._line = bytearray()

    def feed(self, data: bytes) -> int:
        at = 0
        end = len(data)
        while at < end and not self.done:
            state = self._state
            if state == "head":
                at = self._feed_head(data, at)
            elif state in ("length", "data"):
                taken = min(self._left, end - at)
                self._left -= taken
                at += taken
                if self._left == 0:
                    self._data_done()
            elif state in ("size", "trailer"):
                at = self._feed_line(data, at)
            else:  # "close": everything until the connection closes is the body
                return end
        return at

    def _feed_head(self, data: bytes, at: int) -> int:
        # The end marker may straddle two reads: look from 3 bytes back.
        start = max(len(self._head) - 3, 0)
        self._head += data[at:]
        found = self._head.find(HEAD_END, start)
        if found < 0:
            if len(self._head) > MAX_HEAD_BYTES:
                raise FramingError("answer head too long")
            return len(data)
        used = len(data) - (len(self._head) - found - 4)
        del self._head[found + 4 :]
        self.head_bytes = found + 4
        self._read_head(bytes(self._head[:found]))
        return used

    def _read_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ", 2)
        if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or not status[1].isdigit():
            raise FramingError(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
        self.status = int(status[1])
        self.keep_alive = status[0] == b"HTTP/1.1"
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            text = value.strip().lower()
            if key == b"content-length":
                if not text.isdigit() or (length is not None and int(text) != length):
                    raise FramingError("bad Content-Length")
                length = int(text)
            elif key == b"transfer-encoding":
                chunked = text.endswith(b"chunked")
            elif key == b"connection":
                self.keep_alive = self.keep_alive and b"close" not in text
        if 100 <= self.status < 200:
            raise FramingError(f"status {self.status} is not passed on by the front")
        if self._no_body or self.status in (204, 304):
            self.done = True  # a head and nothing after it
            return
        self.chunked = chunked
        if chunked:
            self._state = "size"
        elif length is not None:
            self._state, self._left = "length", length
            if length == 0:
                self.done = True
        else:
            self._state, self.keep_alive = "close", False

    def _feed_line(self, data: bytes, at: int) -> int:
        found = data.find(b"\n", at)
        if found < 0:
            self._line += data[at:]
            if len(self._line) > MAX_HEAD_BYTES:
                raise FramingError("chunk line too long")
            return len(data)
        self._line += data[at:found]
        line = bytes(self._line).rstrip(b"\r")
        self._line.clear()
        if self._state == "size":
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise FramingError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                self._state = "trailer"
            else:
                self._state, self._left = "data", size + 2  # the chunk and its CRLF
        elif not line:  # the blank line that ends the trailer
            self.done = True
        return found + 1

    def _data_done(self) -> None:
        if self._state == "length":
            self.done = True
        else:
            self._state = "size"

    def closed(self) -> bool:
        """The connection closed: was this answer whole?"""
        if self._state == "close":
            self.done = True
        return self.done
