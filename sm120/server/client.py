"""The client for an OpenAI-compatible server's API (vLLM, SGLang): models, chat, health.

Commands that use the API receive a `ServerClient`, so tests can point it at a scripted
server. It and the benchmarks' streaming `sm120.server.wire.Wire` are two faces of one HTTP
core, `sm120.server.transport`. HTTP that does not go through that core, and why:
- the monitor's polls (sm120.monitor.poll_loop, .metrics, .watched): a client without
  keep-alive, so a connection left open never holds the port a restart needs; /metrics is
  still read through the core's `bounded_request`;
- one-shot reads within seconds: `status`'s /metrics (through `bounded_request`;
  sm120.deploy.status, whose /health is `ServerClient.health`) and the gateway's /health
  probe (sm120.gateway.control);
- registries and PyPI, which are not model servers (sm120.images.pins, .updates);
- aiohttp: the load generator, whose streaming must add as little as it can to every TTFT
  (sm120.measure.load), and the gateway, an aiohttp server that proxies from its own event
  loop (sm120.gateway.server, .proxy, .actions).

The API key goes into the Authorization header and nowhere else: not into messages, hints
or reprs, and any server text quoted in an error has it masked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sm120.server.timing import decode_rate
from sm120.server.transport import (
    CHAT_PATH,
    ApiKeyRejected,
    BadServerResponse,
    Connection,
    ServerClientError,
    ServerTimeout,
    ServerUnreachable,
    TransportWording,
    allow_stalls,
    bounded_body,
    bounded_request,
    event_payloads,
    generation_options,
    json_object,
    stream_error,
    stream_timeout,
)

# The client's API; the core's errors and bounded read come with it for its callers.
__all__ = [
    "ApiKeyRejected",
    "BadServerResponse",
    "ChatResult",
    "OnDelta",
    "ServerClient",
    "ServerClientError",
    "ServerTimeout",
    "ServerUnreachable",
    "SmokeResult",
    "bounded_request",
    "smoke_test",
]

HEALTH_PATH = "/health"
SMOKE_PROMPT = "Reply with exactly: READY"

OnDelta = Callable[[str, str], None]
"""Called as on_delta(kind, text) with kind "reasoning" or "content"."""

_WORDING = TransportWording(
    unreachable_hint="check that the server is running and listening on that host and port",
    timeout_words="within the client timeout",
    timeout_hint="the server may be busy compiling or wedged; check its log",
    broken_hint="the server may have crashed; check its log",
)


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


class ServerClient(Connection):
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        socket: str | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, _WORDING, socket)

    def health(self) -> int | None:
        """HTTP status of /health; None when nothing answers (refused, reset, timed out)."""
        try:
            # The body is never read: only the status says anything.
            with self._http.stream("GET", HEALTH_PATH) as response:
                return response.status_code
        except httpx.TransportError:
            return None

    def models(self) -> list[str]:
        return [str(entry["id"]) for entry in self._model_entries() if "id" in entry]

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
        response = self._request("POST", CHAT_PATH, json=body)
        self._raise_for_status(response, CHAT_PATH)
        return _parse_completion(json_object(response, CHAT_PATH), time.perf_counter() - started)

    def _chat_streaming(
        self, body: dict[str, Any], started: float, on_delta: OnDelta | None
    ) -> ChatResult:
        stream = _StreamState(started=started, on_delta=on_delta)
        with (
            self._translated(CHAT_PATH),
            self._http.stream(
                "POST", CHAT_PATH, json=body, timeout=stream_timeout(self._http.timeout)
            ) as response,
        ):
            allow_stalls(response, self._http.timeout)
            if response.status_code >= 400:
                self._raise_for_status(bounded_body(response, CHAT_PATH), CHAT_PATH)
            for payload in event_payloads(response, CHAT_PATH, self._mask, until_done=True):
                stream.feed(payload, self._mask)
        return stream.result(time.perf_counter())


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
            decode_tps=decode_rate(self.completion_tokens, self.first_text_at, self.last_text_at),
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


def _chat_body(
    messages: Sequence[Mapping[str, Any]],
    model: str,
    max_tokens: int | None,
    temperature: float | None,
    thinking: bool | None,
    stream: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": list(messages), "stream": stream}
    generation_options(body, max_tokens, temperature, thinking)
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
    except (json.JSONDecodeError, RecursionError):  # deeply nested arrays
        raise BadServerResponse(
            f"the stream sent a line that is not JSON: {mask(payload[:120])}"
        ) from None
    if not isinstance(chunk, dict):
        raise BadServerResponse("the stream sent a chunk that is not a JSON object")
    problem = stream_error(chunk)
    if problem is not None:
        raise BadServerResponse(f"the server reported an error mid-stream: {mask(problem)}")
    return chunk
