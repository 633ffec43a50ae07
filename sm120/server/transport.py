"""The HTTP core under both clients of an OpenAI-compatible server (`client.ServerClient`,
`wire.Wire`): one connection pool, bounded reads, event streams, one-line errors.

Both clients are `Connection`s, so a root URL, the API key, a refused or broken connection,
an HTTP error status and a body past its bound read the same through either; each client
only says how its users are told what to do next (`TransportWording`).

The API key goes into request headers and nowhere else: not into messages, hints or reprs,
and any server text quoted in an error has it masked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from sm120.core.bounded import MIB, size_words
from sm120.core.errors import SM120Error

# An answer is read up to these bounds and refused past them: a broken or hostile server
# must not grow the client without limit (a whole non-streamed answer; one stream line).
MAX_BODY_BYTES = 32 * MIB
MAX_EVENT_BYTES = 8 * MIB
# A whole event stream, counted on the wire: an endless stream ends here, however it is cut.
MAX_STREAM_BYTES = MAX_BODY_BYTES
# A streamed answer is bounded in time too. vLLM and SGLang send the headers of an event stream
# as soon as the request is accepted, so a server silent that long is not one; between bytes
# the prefill of a long prompt may take minutes, a stall past STREAM_STALL_S is a wedged one.
STREAM_HEADERS_S = 30.0
STREAM_STALL_S = 300.0
# What a line of an event stream may start with (https://html.spec.whatwg.org/#event-stream).
_SSE_FIELDS = ("data:", "event:", "id:", "retry:", ":")
_NOT_A_SERVER_HINT = "this is not what vLLM or SGLang send; check what listens on that port"
# The endpoints both clients use.
CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"

_Self = TypeVar("_Self", bound="Connection")


class ServerClientError(SM120Error):
    """A request to the model server failed."""


class ServerUnreachable(ServerClientError):
    """Nothing answered at the server's address, or the connection broke."""


class ApiKeyRejected(ServerClientError):
    """The server answered 401."""


class ServerTimeout(ServerClientError):
    """The server took longer than the client's timeout to answer."""


class BadServerResponse(ServerClientError):
    """An HTTP error status, or a body that is not the expected OpenAI shape."""


@dataclass(frozen=True)
class TransportWording:
    """How one door words a request that got no HTTP answer: its users know different commands."""

    unreachable_hint: str
    timeout_words: str
    """Ends "<path> on <url> did not answer ...": how long the client waited."""
    timeout_hint: str
    broken_hint: str


class Connection:
    """One connection pool to one server, with its API key and its wording of failures."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        timeout: float | httpx.Timeout,
        wording: TransportWording,
        socket: str | None = None,
    ) -> None:
        """`socket`: a unix socket the server listens on (a warded engine's), reached with
        base_url's Host header and paths; None: base_url's host and port."""
        self.base_url = server_root(base_url)
        self._api_key = api_key or None
        self._wording = wording
        transport = httpx.HTTPTransport(uds=socket) if socket else None
        self._http = httpx.Client(
            base_url=self.base_url, headers=self._key_headers(), timeout=timeout,
            transport=transport,
        )  # fmt: skip

    def _key_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def __repr__(self) -> str:
        key = "<set>" if self._api_key else None
        return f"{type(self).__name__}(base_url={self.base_url!r}, api_key={key})"

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _translated(self, path: str) -> AbstractContextManager[None]:
        """Where a request to `path` runs: no answer at all becomes a one-line error."""
        return translate_transport_errors(self.base_url, path, self._wording)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A whole answer, bounded."""
        with self._translated(path):
            return bounded_request(self._http, method, path, **kwargs)

    def _get_json(self, path: str) -> dict[str, Any]:
        response = self._request("GET", path)
        self._raise_for_status(response, path)
        return json_object(response, path)

    def _model_entries(self) -> list[dict[str, Any]]:
        """The objects in /v1/models' 'data' list: what is served, read alike by both clients."""
        entries = self._get_json(MODELS_PATH).get("data")
        if not isinstance(entries, list):
            raise BadServerResponse(f"{MODELS_PATH} answered without a 'data' list")
        return [entry for entry in entries if isinstance(entry, dict)]

    def _raise_for_status(self, response: httpx.Response, path: str) -> None:
        check_status(response, path, self.base_url, self._api_key)

    def _mask(self, text: str) -> str:
        return mask_secret(text, self._api_key)


def server_root(base_url: str) -> str:
    """Accept http://host:port, http://host:port/ or http://host:port/v1; anything else that
    is not an http(s) URL with a host and a valid port is one line, before any request."""
    root = base_url.strip()
    if "://" not in root:
        root = f"http://{root}"
    root = root.rstrip("/").removesuffix("/v1")
    _check_url(root, base_url)
    return root


class BadUrl(ServerClientError):
    """A server address that is no http(s) URL."""


def _check_url(root: str, given: str) -> None:
    shown = given if len(given) <= 80 else given[:77] + "..."
    try:
        url = httpx.URL(root)
        port = url.port
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise BadUrl(f"{shown!r} is not a URL ({exc})", _URL_HINT) from None
    if url.scheme not in ("http", "https") or not url.host:
        raise BadUrl(f"{shown!r} is not an http(s) URL with a host", _URL_HINT)
    if port is not None and not 1 <= port <= 65535:
        raise BadUrl(f"{shown!r} names port {port}, outside 1-65535", _URL_HINT)


_URL_HINT = "give the server's address, e.g. http://127.0.0.1:8000"


def bounded_request(http: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """A whole answer, read up to MAX_BODY_BYTES (httpx would read any length into memory)."""
    with http.stream(method, path, **kwargs) as streamed:
        return bounded_body(streamed, path)


def bounded_body(response: httpx.Response, path: str) -> httpx.Response:
    """`response` (still streaming) with its body read, refused past MAX_BODY_BYTES."""
    parts: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadServerResponse(
                f"{path} answered with more than {size_words(MAX_BODY_BYTES)}", _NOT_A_SERVER_HINT
            )
        parts.append(chunk)
    # The body is already decoded: drop the headers that describe the wire form.
    headers = [
        (key, value)
        for key, value in response.headers.items()
        if key.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    return httpx.Response(
        response.status_code, headers=headers, content=b"".join(parts), request=response.request
    )


def stream_timeout(configured: httpx.Timeout) -> httpx.Timeout:
    """The timeout to open a stream with: the headers come within STREAM_HEADERS_S (or the
    client's own read timeout, when that is shorter)."""
    return httpx.Timeout(_at_most(configured.read, STREAM_HEADERS_S), connect=configured.connect)


def allow_stalls(response: httpx.Response, configured: httpx.Timeout) -> None:
    """Once the headers came, wait up to STREAM_STALL_S (or the client's own read timeout,
    when shorter) between bytes of the body. httpcore reads the request's timeout extension
    when the body starts, so this takes effect there."""
    timeouts = response.request.extensions.get("timeout")
    if isinstance(timeouts, dict):
        timeouts["read"] = _at_most(configured.read, STREAM_STALL_S)


def _at_most(configured: float | None, bound: float) -> float:
    return bound if configured is None else min(configured, bound)


def event_lines(
    response: httpx.Response, path: str, deadline: Deadline | None = None
) -> Iterator[str]:
    """The lines of an event stream, each bounded by MAX_EVENT_BYTES and all of them together
    by MAX_STREAM_BYTES, and by `deadline` in time (a stream that trickles forever sends
    bytes before every stall bound). Each chunk is searched once, so a line sent a byte at a
    time costs linear time, not quadratic."""
    pieces: list[bytes] = []  # the line being read, not yet ended
    pending = 0
    total = 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > MAX_STREAM_BYTES:
            raise BadServerResponse(
                f"{path} streamed more than {size_words(MAX_STREAM_BYTES)}", _NOT_A_SERVER_HINT
            )
        if deadline is not None:
            deadline.check(path)
        *complete, rest = chunk.split(b"\n")
        for part in complete:
            pieces.append(part)
            yield _decoded_line(b"".join(pieces))
            pieces, pending = [], 0
        pieces.append(rest)
        pending += len(rest)
        if pending > MAX_EVENT_BYTES:
            raise BadServerResponse(
                f"{path} streamed a line longer than {size_words(MAX_EVENT_BYTES)}",
                _NOT_A_SERVER_HINT,
            )
    if pending:
        yield _decoded_line(b"".join(pieces))


@dataclass(frozen=True)
class Deadline:
    """The moment a whole exchange must be over by (time.monotonic), and its length."""

    at: float
    seconds: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def check(self, path: str) -> None:
        if time.monotonic() > self.at:
            raise BadServerResponse(
                f"{path} was still streaming after {self.seconds:g} s",
                "a server that never ends its answer is wedged or not a model server; "
                "check 'sm120 logs'",
            )


def _decoded_line(raw: bytes) -> str:
    return raw.rstrip(b"\r").decode("utf-8", errors="replace")


def event_payloads(
    response: httpx.Response,
    path: str,
    mask: Callable[[str], str],
    *,
    until_done: bool,
    deadline: Deadline | None = None,
) -> Iterator[str]:
    """The `data:` payloads of a server-sent event stream, up to `[DONE]`.

    Anything else than event-stream lines is refused, so a page of text answered with 200 is
    an error rather than an empty answer; with `until_done`, so is a stream that ends
    without `[DONE]` (the OpenAI API always sends it; the Anthropic one never does)."""
    for line in event_lines(response, path, deadline):
        if not line.strip():
            continue
        if not line.startswith(_SSE_FIELDS):
            raise BadServerResponse(
                f"{path} answered with text that is not an event stream: {mask(line[:80])}",
                "check that an OpenAI-compatible server (vLLM, SGLang) listens on that port",
            )
        if not line.startswith("data:"):
            continue  # event names, ids, ": keep-alive" comments
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            return
        yield payload
    if until_done:
        raise BadServerResponse(
            f"the {path} stream ended before [DONE]",
            "the server may have crashed mid-answer; check its log",
        )


def mask_secret(text: str, secret: str | None) -> str:
    """Servers echo request details in errors: never let the API key reach the user."""
    return text.replace(secret, "***") if secret else text


@contextmanager
def translate_transport_errors(
    base_url: str, path: str, wording: TransportWording
) -> Iterator[None]:
    """Turn httpx's refused / timed-out / broken connections into one-line sm120 errors."""
    try:
        yield
    except httpx.ConnectError as exc:
        raise ServerUnreachable(
            f"server not reachable at {base_url}", wording.unreachable_hint
        ) from exc
    except httpx.TimeoutException as exc:
        raise ServerTimeout(
            f"{path} on {base_url} did not answer {wording.timeout_words}", wording.timeout_hint
        ) from exc
    except httpx.DecodingError as exc:
        # Content-Encoding: gzip over bytes that are not gzip (httpx decodes as it reads).
        raise BadServerResponse(
            f"{path} on {base_url} answered with a body its Content-Encoding does not "
            "describe (it does not decode)",
            _NOT_A_SERVER_HINT,
        ) from exc
    except httpx.TransportError as exc:
        raise ServerUnreachable(
            f"connection to {base_url} broke during {path} ({type(exc).__name__})",
            wording.broken_hint,
        ) from exc


def check_status(response: httpx.Response, path: str, base_url: str, api_key: str | None) -> None:
    """One-line errors for HTTP failures, shared by every client that talks to the server."""
    if response.status_code == 401:
        what = "rejected the API key" if api_key else "requires an API key"
        raise ApiKeyRejected(
            f"the server at {base_url} {what} (HTTP 401 on {path})",
            "use the API key stored in the deployment's state directory",
        )
    if response.status_code >= 400:
        detail = mask_secret(error_text(response), api_key)
        raise BadServerResponse(f"{path} answered HTTP {response.status_code}: {detail}")


def json_object(response: httpx.Response, path: str) -> dict[str, Any]:
    """The response body as a JSON object, or a one-line error naming the path."""
    try:
        data = response.json()
    except (ValueError, RecursionError):  # not JSON, or nested past the stack
        raise BadServerResponse(f"{path} answered with a body that is not JSON") from None
    if not isinstance(data, dict):
        raise BadServerResponse(f"{path} answered with JSON that is not an object")
    return data


def error_text(response: httpx.Response) -> str:
    """What an error answer says, in at most 200 characters."""
    try:
        data = response.json()
    except (ValueError, RecursionError):  # not JSON, or nested past the stack
        return response.text.strip()[:200] or response.reason_phrase
    if isinstance(data, dict):
        return stream_error(data) or str(data.get("message") or data.get("detail") or data)[:200]
    return str(data)[:200]


def stream_error(chunk: Mapping[str, Any]) -> str | None:
    """The message of an error object (OpenAI's or Anthropic's), or None when it is not one."""
    if chunk.get("type") == "error" or chunk.get("object") == "error" or "error" in chunk:
        # vLLM answers {"message": ...} or {"error": {"message": ...}} or {"error": "..."}.
        error = chunk.get("error")
        if isinstance(error, dict):
            return str(error.get("message") or error)[:200]
        return str(error or chunk.get("message") or chunk)[:200]
    return None


def generation_options(
    body: dict[str, Any], max_tokens: int | None, temperature: float | None, thinking: bool | None
) -> None:
    """Add the sampling options a request sets to its body (both chat APIs spell them alike)."""
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if thinking is not None:
        # GLM templates read enable_thinking, DeepSeek ones read thinking: send both.
        body["chat_template_kwargs"] = {"enable_thinking": thinking, "thinking": thinking}
