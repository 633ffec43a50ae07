"""The client for an OpenAI-compatible server's API (vLLM, SGLang): models, chat, health.

Commands that use the API receive a `ServerClient`, so tests can point it at a scripted
server. It is not the only HTTP in sm120 (yet): the benchmarks stream through
sm120.server.wire, the monitor scrapes /metrics and probes /health (sm120.monitor.service,
.metrics, .target), `status` and the gateway probe /health (sm120.deploy.status,
sm120.gateway.control), `build --refresh-pins` / `recipes updates` ask registries and PyPI
(sm120.images.pins, .updates), and the load generator and the gateway's proxy use aiohttp
(sm120.measure.load, sm120.gateway.proxy, .actions).

The API key goes into the Authorization header and nowhere else: not into messages, hints
or reprs, and any server text quoted in an error has it masked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from sm120.core.bounded import MIB, size_words
from sm120.core.errors import SM120Error

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
HEALTH_PATH = "/health"
SMOKE_PROMPT = "Reply with exactly: READY"
# An answer is read up to these bounds and refused past them: a broken or hostile server
# must not grow the client without limit (a whole non-streamed answer; one stream line).
MAX_BODY_BYTES = 32 * MIB
MAX_EVENT_BYTES = 8 * MIB
# What a line of an event stream may start with (https://html.spec.whatwg.org/#event-stream).
_SSE_FIELDS = ("data:", "event:", "id:", "retry:", ":")

OnDelta = Callable[[str, str], None]
"""Called as on_delta(kind, text) with kind "reasoning" or "content"."""


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
class ChatResult:
    content: str
    reasoning: str
    finish_reason: str | None
    completion_tokens: int | None
    ttft_s: float | None
    """Streaming only: seconds from sending to the first content or reasoning text."""
    total_s: float
    decode_tps: float | None
    """Tokens after the first per second after the first; None when not measurable."""


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    content: str
    reasoning: str
    finish_reason: str | None
    failure_id: str | None
    message: str


class ServerClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = server_root(base_url)
        self._api_key = api_key or None
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def __repr__(self) -> str:
        key = "<set>" if self._api_key else None
        return f"ServerClient(base_url={self.base_url!r}, api_key={key})"

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def health(self) -> int | None:
        """HTTP status of /health; None when nothing answers (refused, reset, timed out)."""
        try:
            # The body is never read: only the status says anything.
            with self._http.stream("GET", HEALTH_PATH) as response:
                return response.status_code
        except httpx.TransportError:
            return None

    def models(self) -> list[str]:
        with translate_transport_errors(self.base_url, MODELS_PATH, _WORDING):
            response = bounded_request(self._http, "GET", MODELS_PATH)
        self._raise_for_status(response, MODELS_PATH)
        entries = json_object(response, MODELS_PATH).get("data")
        if not isinstance(entries, list):
            raise BadServerResponse(f"{MODELS_PATH} answered without a 'data' list")
        return [str(entry["id"]) for entry in entries if isinstance(entry, dict) and "id" in entry]

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        model: str,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        thinking: bool | None = None,
        stream: bool = False,
        on_delta: OnDelta | None = None,
    ) -> ChatResult:
        body = _chat_body(messages, model, max_tokens, temperature, thinking, stream)
        started = time.perf_counter()
        if stream:
            return self._chat_streaming(body, started, on_delta)
        with translate_transport_errors(self.base_url, CHAT_PATH, _WORDING):
            response = bounded_request(self._http, "POST", CHAT_PATH, json=body)
        self._raise_for_status(response, CHAT_PATH)
        return _parse_completion(json_object(response, CHAT_PATH), time.perf_counter() - started)

    def _chat_streaming(
        self, body: dict[str, Any], started: float, on_delta: OnDelta | None
    ) -> ChatResult:
        stream = _StreamState(started=started, on_delta=on_delta)
        with (
            translate_transport_errors(self.base_url, CHAT_PATH, _WORDING),
            self._http.stream("POST", CHAT_PATH, json=body) as response,
        ):
            if response.status_code >= 400:
                self._raise_for_status(bounded_body(response, CHAT_PATH), CHAT_PATH)
            for payload in event_payloads(response, CHAT_PATH, self._mask, until_done=True):
                stream.feed(payload, self._mask)
        return stream.result(time.perf_counter())

    def _raise_for_status(self, response: httpx.Response, path: str) -> None:
        check_status(response, path, self.base_url, self._api_key, _error_text)

    def _mask(self, text: str) -> str:
        return mask_secret(text, self._api_key)


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
                f"{path} answered with more than {size_words(MAX_BODY_BYTES)}",
                "this is not what vLLM or SGLang send; check what listens on that port",
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


def event_lines(response: httpx.Response, path: str) -> Iterator[str]:
    """The lines of an event stream, each bounded by MAX_EVENT_BYTES."""
    partial = b""
    for chunk in response.iter_bytes():
        *complete, partial = (partial + chunk).split(b"\n")
        for line in complete:
            yield line.rstrip(b"\r").decode("utf-8", errors="replace")
        if len(partial) > MAX_EVENT_BYTES:
            raise BadServerResponse(
                f"{path} streamed a line longer than {size_words(MAX_EVENT_BYTES)}",
                "this is not what vLLM or SGLang send; check what listens on that port",
            )
    if partial:
        yield partial.rstrip(b"\r").decode("utf-8", errors="replace")


def event_payloads(
    response: httpx.Response, path: str, mask: Callable[[str], str], *, until_done: bool
) -> Iterator[str]:
    """The `data:` payloads of a server-sent event stream, up to `[DONE]`.

    Anything else than event-stream lines is refused, so a page of text answered with 200 is
    an error rather than an empty answer; with `until_done`, so is a stream that ends
    without `[DONE]` (the OpenAI API always sends it; the Anthropic one never does)."""
    for line in event_lines(response, path):
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


@dataclass(frozen=True)
class TransportWording:
    """How one door words a request that got no HTTP answer: its users know different commands."""

    unreachable_hint: str
    timeout_words: str
    """Ends "<path> on <url> did not answer ...": how long the client waited."""
    timeout_hint: str
    broken_hint: str


_WORDING = TransportWording(
    unreachable_hint="check that the server is running and listening on that host and port",
    timeout_words="within the client timeout",
    timeout_hint="the server may be busy compiling or wedged; check its log",
    broken_hint="the server may have crashed; check its log",
)


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
    except httpx.TransportError as exc:
        raise ServerUnreachable(
            f"connection to {base_url} broke during {path} ({type(exc).__name__})",
            wording.broken_hint,
        ) from exc


def check_status(
    response: httpx.Response,
    path: str,
    base_url: str,
    api_key: str | None,
    error_text: Callable[[httpx.Response], str],
) -> None:
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


def smoke_test(
    client: ServerClient, model: str, *, thinking: bool, max_tokens: int = 64
) -> SmokeResult:
    """Ask for a one-word answer; a server is only usable if it produces content.

    Greedy sampling on purpose: it is the path every build supports.
    """
    result = client.chat(
        [{"role": "user", "content": SMOKE_PROMPT}],
        model,
        max_tokens=max_tokens,
        temperature=0.0,
        thinking=thinking,
    )
    verdict = _judge_smoke(result, max_tokens)
    return SmokeResult(
        ok=verdict.ok,
        content=result.content,
        reasoning=result.reasoning,
        finish_reason=result.finish_reason,
        failure_id=verdict.failure_id,
        message=verdict.message,
    )


@dataclass(frozen=True)
class _Verdict:
    ok: bool
    message: str
    failure_id: str | None = None


def _judge_smoke(result: ChatResult, max_tokens: int) -> _Verdict:
    if result.content.strip():
        return _Verdict(True, f"answered: {result.content.strip()[:80]}")
    if result.finish_reason == "length":
        return _Verdict(
            False,
            f"no content: reasoning spent the whole max_tokens budget ({max_tokens}) before "
            "any answer; raise max_tokens to 2000 or more, or turn thinking off",
            "F12",
        )
    if result.reasoning.strip():
        return _Verdict(
            False,
            f"no content: all output went to reasoning (finish_reason={result.finish_reason}); "
            "the reasoning parser never saw the end of the thinking block",
        )
    return _Verdict(
        False, f"the server answered with no text (finish_reason={result.finish_reason})"
    )


@dataclass
class _StreamState:
    """What a streamed chat has delivered so far."""

    started: float
    on_delta: OnDelta | None
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int | None = None
    first_text_at: float | None = None
    last_text_at: float | None = None

    def feed(self, payload: str, mask: Callable[[str], str]) -> None:
        """Handle the JSON payload of one `data:` line."""
        chunk = _decode_chunk(payload, mask)
        self._take_usage(chunk)
        choices = chunk.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise BadServerResponse("the stream sent 'choices' that are not a list of objects")
        for choice in choices:
            self._take_choice(choice)

    def result(self, ended: float) -> ChatResult:
        ttft = None if self.first_text_at is None else self.first_text_at - self.started
        return ChatResult(
            content="".join(self.content),
            reasoning="".join(self.reasoning),
            finish_reason=self.finish_reason,
            completion_tokens=self.completion_tokens,
            ttft_s=ttft,
            total_s=ended - self.started,
            decode_tps=_decode_rate(self.completion_tokens, self.first_text_at, self.last_text_at),
        )

    def _take_usage(self, chunk: Mapping[str, Any]) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.completion_tokens = usage["completion_tokens"]

    def _take_choice(self, choice: Mapping[str, Any]) -> None:
        if choice.get("index", 0) != 0:
            return
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise BadServerResponse("the stream sent a 'delta' that is not a JSON object")
        self._take_text(
            "reasoning", _text_field(delta, "reasoning", "reasoning_content"), self.reasoning
        )
        self._take_text("content", _text_field(delta, "content"), self.content)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def _take_text(self, kind: str, text: str, parts: list[str]) -> None:
        if not text:
            return  # vLLM opens with an empty role-only delta: not a token
        now = time.perf_counter()
        if self.first_text_at is None:
            self.first_text_at = now
        self.last_text_at = now
        parts.append(text)
        if self.on_delta is not None:
            self.on_delta(kind, text)


def server_root(base_url: str) -> str:
    """Accept http://host:port, http://host:port/ or http://host:port/v1."""
    root = base_url.strip().rstrip("/")
    if "://" not in root:
        root = f"http://{root}"
    return root.removesuffix("/v1")


def _chat_body(
    messages: Sequence[Mapping[str, Any]],
    model: str,
    max_tokens: int | None,
    temperature: float | None,
    thinking: bool | None,
    stream: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": list(messages), "stream": stream}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if thinking is not None:
        # GLM templates read enable_thinking, DeepSeek ones read thinking: send both.
        body["chat_template_kwargs"] = {"enable_thinking": thinking, "thinking": thinking}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _text_field(delta: Mapping[str, Any], *names: str) -> str:
    """The first of `names` present in a streamed delta, which must be text (or null)."""
    for name in names:
        value = delta.get(name)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise BadServerResponse(
                f"the stream sent a delta whose '{name}' is {type(value).__name__}, not text",
                "check that an OpenAI-compatible server (vLLM, SGLang) listens on that port",
            )
        return value
    return ""


def _reasoning_of(message: Mapping[str, Any]) -> str:
    # Newer vLLM says "reasoning", older vLLM and SGLang "reasoning_content"; some versions
    # send both with the same text, so take one.
    text = message.get("reasoning") or message.get("reasoning_content") or ""
    return str(text)


def _parse_completion(data: Mapping[str, Any], total_s: float) -> ChatResult:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadServerResponse(f"{CHAT_PATH} answered without choices")
    message = choices[0].get("message") or {}
    usage = data.get("usage") or {}
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return ChatResult(
        content=str(message.get("content") or ""),
        reasoning=_reasoning_of(message),
        finish_reason=choices[0].get("finish_reason"),
        completion_tokens=tokens if isinstance(tokens, int) else None,
        ttft_s=None,
        total_s=total_s,
        decode_tps=None,
    )


def _decode_chunk(payload: str, mask: Callable[[str], str]) -> dict[str, Any]:
    try:
        chunk = json.loads(payload)
    except json.JSONDecodeError:
        raise BadServerResponse(
            f"the stream sent a line that is not JSON: {mask(payload[:120])}"
        ) from None
    if not isinstance(chunk, dict):
        raise BadServerResponse("the stream sent a chunk that is not a JSON object")
    if chunk.get("object") == "error" or "error" in chunk:
        raise BadServerResponse(
            f"the server reported an error mid-stream: {mask(_message_of(chunk))}"
        )
    return chunk


def _decode_rate(tokens: int | None, first: float | None, last: float | None) -> float | None:
    if tokens is None or tokens < 2 or first is None or last is None or last <= first:
        return None
    return (tokens - 1) / (last - first)


def json_object(response: httpx.Response, path: str) -> dict[str, Any]:
    """The response body as a JSON object, or a one-line error naming the path."""
    try:
        data = response.json()
    except ValueError:
        raise BadServerResponse(f"{path} answered with a body that is not JSON") from None
    if not isinstance(data, dict):
        raise BadServerResponse(f"{path} answered with JSON that is not an object")
    return data


def _error_text(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason_phrase
    return _message_of(data) if isinstance(data, dict) else str(data)[:200]


def _message_of(data: Mapping[str, Any]) -> str:
    # vLLM answers {"message": ...} or {"error": {"message": ...}} or {"error": "..."}.
    error = data.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)[:200]
    return str(data.get("message") or error or data)[:200]
