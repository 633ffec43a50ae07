"""The HTTP door for measurement traffic: streamed chat (with tool calls), streamed Anthropic
messages, /tokenize, /metrics and /v1/models.

`sm120.server.client` serves the launch probe and `sm120 chat`; this module adds what gates and
benchmarks need on top: tool calls, the /v1/messages protocol, token usage and the moment of
every streamed token. Both stand on one HTTP core (`sm120.server.transport`): the same
connection, bounds and errors; the API key never leaves the Authorization / x-api-key headers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sm120.core.bounded import MIB, size_words
from sm120.server.timing import decode_rate
from sm120.server.transport import (
    CHAT_PATH,
    BadServerResponse,
    Connection,
    Deadline,
    ServerTimeout,
    TransportWording,
    allow_stalls,
    bounded_body,
    bounded_request,
    error_text,
    event_payloads,
    generation_options,
    json_object,
    stream_error,
    stream_timeout,
)

MESSAGES_PATH = "/v1/messages"
TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"
METRICS_PATH = "/metrics"

# One tool call's input, as streamed: far above what an agent writes in one call (a whole
# file), far below what would be sent back with every later turn of the conversation.
MAX_TOOL_INPUT_BYTES = 8 * MIB

# Anthropic stop reasons in OpenAI's words, so every check reads one vocabulary.
_STOP_REASONS = {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls"}

# Gates and benchmarks run against a deployment sm120 manages: point at its commands.
_WORDING = TransportWording(
    unreachable_hint="check that the deployment is running: sm120 status",
    timeout_words="in time",
    timeout_hint="the server may be compiling a new shape or wedged; check 'sm120 logs'",
    broken_hint="the server may have crashed; check 'sm120 logs'",
)


@dataclass(frozen=True)
class ServedModel:
    id: str
    root: str | None
    """What the engine loaded (a local path for vLLM): the tokenizer for `vllm bench serve`."""
    max_model_len: int | None


@dataclass
class ToolCall:
    name: str = ""
    arguments: str = ""
    """The arguments as streamed: JSON text, checked by the gate, not trusted here."""
    id: str = ""


@dataclass
class Exchange:
    """One streamed request and what came back, with the moment of each piece."""

    api: str
    started: float
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_at: float | None = None
    last_at: float | None = None
    ended: float | None = None
    error: str | None = None
    """An HTTP error status or a mid-stream error: the request failed, the server is up."""
    events: list[tuple[str, int | None]] = field(default_factory=list)
    """Anthropic streams: each event's type and content-block index, in arrival order."""

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_at is None else self.first_at - self.started

    @property
    def prefill_tps(self) -> float | None:
        ttft = self.ttft_s
        if not self.prompt_tokens or not ttft or ttft <= 0:
            return None
        return self.prompt_tokens / ttft

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first, per second after the first, to the end of the stream: what
        `vllm bench serve` calls 1/TPOT. The end of the stream rather than the last text:
        tokens that complete no character (byte-level pieces) arrive bunched with later ones.
        """
        return decode_rate(self.completion_tokens, self.first_at, self.ended)

    @property
    def total_s(self) -> float:
        return (self.ended or time.perf_counter()) - self.started

    def saw_output(self, now: float) -> None:
        if self.first_at is None:
            self.first_at = now
        self.last_at = now


class Wire(Connection):
    """Synchronous requests for gates and probes; one connection pool per deployment."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        timeout: float = 3600.0,
        exchange_s: float | None = None,
    ) -> None:
        """`timeout` bounds each read; a stream's headers come within STREAM_HEADERS_S and
        its silences last up to STREAM_STALL_S (sm120.server.transport), as in `chat`.
        `exchange_s`: how long one streamed exchange may last in all (None: no bound)."""
        # Long prefills and long answers stream slowly: only connecting is bounded tightly.
        super().__init__(base_url, api_key, httpx.Timeout(timeout, connect=10.0), _WORDING)
        self._exchange_s = exchange_s

    def _key_headers(self) -> dict[str, str]:
        if not self._api_key:
            return {}
        # vLLM reads Authorization on both APIs; Anthropic clients send x-api-key.
        return {"Authorization": f"Bearer {self._api_key}", "x-api-key": self._api_key}

    # --- plain requests -------------------------------------------------------------------

    def served_models(self) -> list[ServedModel]:
        return [_served_model(entry) for entry in self._model_entries()]

    def tokenize(
        self,
        model: str,
        *,
        prompt: str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int] | None:
        """Token ids as the server counts them; None when the server has no /tokenize.
        `special_tokens`: count a prompt as /v1/completions does (BOS included); `tools`
        (with `messages`): chat tools, which the chat template renders into the prompt."""
        body: dict[str, Any] = {"model": model}
        if messages is not None:
            body["messages"] = list(messages)
            if tools:
                body["tools"] = list(tools)
        else:
            body["prompt"] = prompt or ""
            body["add_special_tokens"] = special_tokens
        answer = self._post_if_served(TOKENIZE_PATH, body)
        if answer is None:
            return None
        tokens = answer.get("tokens")
        if not isinstance(tokens, list):
            raise BadServerResponse(f"{TOKENIZE_PATH} answered without a 'tokens' list")
        return [int(t) for t in tokens]

    def detokenize(self, model: str, tokens: Sequence[int]) -> str | None:
        """The text of `tokens`; None when the server has no /detokenize."""
        answer = self._post_if_served(DETOKENIZE_PATH, {"model": model, "tokens": list(tokens)})
        if answer is None:
            return None
        text = answer.get("prompt")
        if not isinstance(text, str):
            raise BadServerResponse(f"{DETOKENIZE_PATH} answered without a 'prompt' string")
        return text

    def _post_if_served(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The JSON answer to a POST of an optional endpoint; None when the server lacks it."""
        response = self._request("POST", path, json=body)
        if response.status_code in (404, 405, 501):
            return None
        self._raise_for_status(response, path)
        return json_object(response, path)

    def metrics_text(self) -> str | None:
        """The Prometheus page, or None when the server does not publish one."""
        try:
            response = bounded_request(self._http, "GET", METRICS_PATH, timeout=10.0)
        except httpx.TransportError:
            return None
        return response.text if response.status_code == 200 else None

    # --- streamed generations -------------------------------------------------------------

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        model: str,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        thinking: bool | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
    ) -> Exchange:
        body: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        generation_options(body, max_tokens, temperature, thinking)
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        return self._generate("chat", CHAT_PATH, body, tools, _ChatChunks)

    def messages(
        self,
        messages: Sequence[Mapping[str, Any]],
        model: str,
        *,
        max_tokens: int,
        system: str | Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        temperature: float | None = None,
        thinking: bool | None = None,
        tool_choice: Mapping[str, Any] | None = None,
    ) -> Exchange:
        """The Anthropic Messages API, which always needs max_tokens. `system` is a string or
        a list of text blocks (Claude Code sends blocks)."""
        body: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "stream": True,
        }
        if system:
            body["system"] = system if isinstance(system, str) else list(system)
        generation_options(body, None, temperature, thinking)
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        return self._generate("messages", MESSAGES_PATH, body, tools, _MessageEvents)

    def _generate(
        self,
        api: str,
        path: str,
        body: dict[str, Any],
        tools: Sequence[Mapping[str, Any]] | None,
        fold: type[_Fold],
    ) -> Exchange:
        if tools:
            body["tools"] = list(tools)
        exchange = Exchange(api=api, started=time.perf_counter())
        folded = fold(exchange)
        try:
            self._stream(path, body, exchange, folded.feed)
        finally:
            folded.finish()  # what came before a failure is kept
        return exchange

    def _stream(self, path: str, body: dict[str, Any], exchange: Exchange, feed: Any) -> None:
        deadline = Deadline.after(self._exchange_s) if self._exchange_s is not None else None
        try:
            self._stream_bounded(path, body, exchange, feed, deadline)
        except (BadServerResponse, ServerTimeout) as exc:
            # A malformed, endless or stalled stream fails this exchange, not the whole run;
            # a server that is gone or refuses the key ends the run (raised on).
            exchange.error = exc.message
        exchange.ended = time.perf_counter()

    def _stream_bounded(
        self,
        path: str,
        body: dict[str, Any],
        exchange: Exchange,
        feed: Any,
        deadline: Deadline | None,
    ) -> None:
        configured = self._http.timeout
        with (
            self._translated(path),
            self._http.stream(
                "POST", path, json=body, timeout=stream_timeout(configured)
            ) as response,
        ):
            allow_stalls(response, configured)
            if response.status_code == 401:
                self._raise_for_status(response, path)
            if response.status_code >= 400:
                answer = bounded_body(response, path)
                exchange.error = f"HTTP {answer.status_code}: {self._mask(error_text(answer))}"
                return
            self._read_events(response, path, exchange, feed, deadline)

    def _read_events(
        self,
        response: httpx.Response,
        path: str,
        exchange: Exchange,
        feed: Any,
        deadline: Deadline | None,
    ) -> None:
        # Chat streams end with [DONE]; Anthropic message streams with a message_stop event.
        payloads = event_payloads(
            response, path, self._mask, until_done=path == CHAT_PATH, deadline=deadline
        )
        for payload in payloads:
            try:
                chunk = json.loads(payload)
            except (json.JSONDecodeError, RecursionError):  # deeply nested arrays
                exchange.error = f"the stream sent a line that is not JSON: {payload[:80]}"
                return
            if not isinstance(chunk, dict):
                continue
            problem = stream_error(chunk)
            if problem:
                exchange.error = f"error mid-stream: {self._mask(problem)}"
                return
            try:
                feed(chunk, time.perf_counter())
            except (AttributeError, TypeError, ValueError):
                # A field of the wrong type (a delta that is a string, an index that is a
                # list): the chunk is not the OpenAI or Anthropic shape.
                exchange.error = f"the stream sent a chunk of an unexpected shape: {payload[:80]}"
                return


class _Parts:
    """Text that arrives in pieces, kept as a list and joined once: `+=` on a field copies
    the whole text at every piece (quadratic: 30 MiB of tool input took minutes)."""

    def __init__(self, limit: int | None = None, what: str = "") -> None:
        self._parts: list[str] = []
        self._size = 0
        self._limit = limit
        self._what = what

    def add(self, text: str) -> None:
        if not text:
            return
        self._size += len(text)
        if self._limit is not None and self._size > self._limit:
            raise BadServerResponse(
                f"the stream sent more than {size_words(self._limit)} of {self._what}",
                "no model writes that much into one call; check what listens on that port",
            )
        self._parts.append(text)

    def text(self) -> str:
        return "".join(self._parts)


class _Fold:
    """Folds the events of one stream into an Exchange, tool calls by their stream index.
    Text is gathered in parts and written into the exchange by finish()."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self._calls: dict[int, ToolCall] = {}
        self._content = _Parts()
        self._reasoning = _Parts()
        self._arguments: dict[int, _Parts] = {}

    def _call_at(self, index: int) -> ToolCall:
        """The tool call streamed at `index`, added to the exchange on first sight."""
        if index not in self._calls:
            self._calls[index] = ToolCall()
            self._arguments[index] = _Parts(MAX_TOOL_INPUT_BYTES, "input for one tool call")
            self.exchange.tool_calls.append(self._calls[index])
        return self._calls[index]

    def _add_arguments(self, index: int, text: str) -> None:
        self._call_at(index)
        self._arguments[index].add(text)

    def feed(self, event: Mapping[str, Any], now: float) -> None:
        """Take one decoded event of the stream, which arrived at `now`."""
        raise NotImplementedError

    def finish(self) -> None:
        self.exchange.content += self._content.text()
        self.exchange.reasoning += self._reasoning.text()
        for index, call in self._calls.items():
            call.arguments += self._arguments[index].text()


class _ChatChunks(_Fold):
    """Folds OpenAI chat.completion.chunk objects into an Exchange."""

    def feed(self, chunk: Mapping[str, Any], now: float) -> None:
        ex = self.exchange
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            ex.prompt_tokens = _int_or(usage.get("prompt_tokens"), ex.prompt_tokens)
            ex.completion_tokens = _int_or(usage.get("completion_tokens"), ex.completion_tokens)
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            # Newer vLLM says "reasoning", older vLLM and SGLang "reasoning_content".
            reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
            content = delta.get("content") or ""
            calls = delta.get("tool_calls") or []
            if reasoning or content or calls:
                ex.saw_output(now)  # the opening role-only delta is not a token
            self._reasoning.add(str(reasoning))
            self._content.add(str(content))
            for call in calls:
                self._take_call(call)
            if choice.get("finish_reason"):
                ex.finish_reason = str(choice["finish_reason"])

    def _take_call(self, call: Mapping[str, Any]) -> None:
        index = int(call.get("index", len(self._calls)))
        target = self._call_at(index)
        function = call.get("function") or {}
        # Ids and names come once, in the call's first delta: short, kept as they come.
        target.id = (target.id + str(call.get("id") or ""))[:256]
        target.name = (target.name + str(function.get("name") or ""))[:256]
        self._add_arguments(index, str(function.get("arguments") or ""))


class _MessageEvents(_Fold):
    """Folds Anthropic message stream events into an Exchange."""

    def feed(self, event: Mapping[str, Any], now: float) -> None:
        ex = self.exchange
        kind = event.get("type")
        index = event.get("index")
        ex.events.append((str(kind)[:64], index if isinstance(index, int) else None))
        if kind == "message_start":
            usage = (event.get("message") or {}).get("usage") or {}
            ex.prompt_tokens = _int_or(usage.get("input_tokens"), ex.prompt_tokens)
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                call = self._call_at(int(event.get("index", 0)))
                call.name = (call.name + str(block.get("name") or ""))[:256]
                call.id = (call.id + str(block.get("id") or ""))[:256]
                ex.saw_output(now)
        elif kind == "content_block_delta":
            self._take_delta(int(event.get("index", 0)), event.get("delta") or {}, now)
        elif kind == "message_delta":
            reason = (event.get("delta") or {}).get("stop_reason")
            if reason:
                ex.finish_reason = _STOP_REASONS.get(str(reason), str(reason))
            usage = event.get("usage") or {}
            ex.completion_tokens = _int_or(usage.get("output_tokens"), ex.completion_tokens)
            ex.prompt_tokens = _int_or(usage.get("input_tokens"), ex.prompt_tokens)

    def _take_delta(self, index: int, delta: Mapping[str, Any], now: float) -> None:
        ex = self.exchange
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            self._content.add(str(delta["text"]))
            ex.saw_output(now)
        elif kind == "thinking_delta" and delta.get("thinking"):
            self._reasoning.add(str(delta["thinking"]))
            ex.saw_output(now)
        elif kind == "input_json_delta" and index in self._calls:
            self._add_arguments(index, str(delta.get("partial_json") or ""))
            ex.saw_output(now)


def _served_model(entry: Mapping[str, Any]) -> ServedModel:
    length = entry.get("max_model_len")
    root = entry.get("root")
    return ServedModel(
        id=str(entry.get("id", "")),
        root=str(root) if root else None,
        max_model_len=length if isinstance(length, int) and length > 0 else None,
    )


def _int_or(value: Any, fallback: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else fallback
