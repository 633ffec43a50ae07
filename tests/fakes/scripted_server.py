"""A scripted OpenAI-compatible server for gate and bench tests (stdlib only, in a thread).

Where tests/fakes/openai_server.py replays a queue of replies for client tests, this one
answers by rule, like a model that knows the answers: the first rule whose regex matches the
last user message decides the reply (content, reasoning, tool calls), on both
/v1/chat/completions and /v1/messages, always streamed. It also speaks the parts of vLLM the
benchmarks use: /v1/completions with text or token-id prompts at a scripted prefill and
decode speed, /tokenize (one token per word) and /detokenize (one word per token),
/v1/models with max_model_len, and /metrics counters, including speculative-decoding drafts
when asked to.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.fakes.loopback_server import LoopbackServer


@dataclass(frozen=True)
class ScriptedTool:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ScriptedTool, ...] = ()
    finish_reason: str = "stop"
    token_delay: float = 0.0


@dataclass
class Rule:
    pattern: str
    answer: Answer


@dataclass
class Speeds:
    """Seconds per prompt token before the first token, and between generated tokens."""

    prefill_per_token: float = 0.0
    decode_per_token: float = 0.0
    burst: bool = False
    """Send every token chunk in one write, as a server starved of CPU does."""


@dataclass
class Counters:
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    prefix_queried: int = 0
    prefix_hits: int = 0


class ScriptedServer(LoopbackServer):
    def __init__(
        self,
        *,
        model: str = "scripted",
        max_model_len: int = 4096,
        api_key: str | None = None,
        speculative: bool = False,
    ) -> None:
        self.model = model
        self.max_model_len = max_model_len
        self.api_key = api_key
        self.speculative = speculative
        self.rules: list[Rule] = []
        self.default = Answer(content="I do not know.")
        self.speeds = Speeds()
        self.counters = Counters()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.cached_blocks: set[tuple[int | str, ...]] = set()
        """Prompts seen (ids, or words for text), as every 16-token block prefix."""
        self.detokenizes = True
        """False: answer /detokenize with 404, as a server without the endpoint."""
        super().__init__(_handler_for(self), _QuietServer)

    def when(self, pattern: str, answer: Answer) -> ScriptedServer:
        self.rules.append(Rule(pattern, answer))
        return self

    def answer_for(self, text: str) -> Answer:
        for rule in self.rules:
            if re.search(rule.pattern, text, re.IGNORECASE):
                return rule.answer
        return self.default


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client closing its keep-alive connection is not news


def words(text: str) -> int:
    return len(text.split())


def message_tokens(messages: list[dict[str, Any]]) -> int:
    total = 0
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        total += words(text) + 4
    return total


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _pieces(text: str) -> list[str]:
    return re.findall(r"\s*\S+\s*", text) if text.strip() else []


def _handler_for(server: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        scripted = server

    return Handler


@dataclass
class _Sent:
    tokens: int = 0
    parts: list[tuple[str, str]] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    scripted: ScriptedServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # Streamed pieces must leave one by one, as a real server's do: without this, Nagle's
        # algorithm holds small writes back until the client's delayed ACK (~40 ms).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # --- routing ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            if self._authorised():
                entry = {
                    "id": self.scripted.model,
                    "root": f"/models/{self.scripted.model}",
                    "max_model_len": self.scripted.max_model_len,
                }
                self._json(200, {"object": "list", "data": [entry]})
        elif self.path == "/metrics":
            self._text(200, self._metrics())
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        with self.scripted.lock:
            self.scripted.requests.append((self.path, body))
        if self.path == "/tokenize":
            self._tokenize(body)
            return
        if self.path == "/detokenize":
            self._detokenize(body)
            return
        if not self._authorised():
            return
        if self.path == "/v1/chat/completions":
            self._chat(body)
        elif self.path == "/v1/messages":
            self._messages(body)
        elif self.path == "/v1/completions":
            self._completions(body)
        else:
            self._json(404, {"detail": "Not Found"})

    # --- endpoints --------------------------------------------------------------------------

    def _tokenize(self, body: dict[str, Any]) -> None:
        if "messages" in body:
            count = message_tokens(body["messages"])
        else:
            count = words(str(body.get("prompt", "")))
        # Ids stand for words: 1000 + a hash bucket, so pools built from them are varied.
        ids = [1000 + (i * 7919) % 5000 for i in range(count)]
        self._json(
            200, {"count": count, "max_model_len": self.scripted.max_model_len, "tokens": ids}
        )

    def _detokenize(self, body: dict[str, Any]) -> None:
        if not self.scripted.detokenizes:
            self._json(404, {"detail": "Not Found"})
            return
        self._json(200, {"prompt": " ".join(f"w{token}" for token in body.get("tokens") or [])})

    def _chat(self, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        answer = self.scripted.answer_for(_last_user_text(messages))
        prompt_tokens = message_tokens(messages)
        if self._too_long(prompt_tokens, body.get("max_tokens")):
            return
        self._start_stream()
        self._event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        sent = _Sent()
        for name, piece in [("reasoning", p) for p in _pieces(answer.reasoning)] + [
            ("content", p) for p in _pieces(answer.content)
        ]:
            self._pause(answer)
            self._event({"choices": [{"index": 0, "delta": {name: piece}}]})
            sent.tokens += 1
        for index, call in enumerate(answer.tool_calls):
            self._pause(answer)
            arguments = json.dumps(call.arguments)
            head = {"index": index, "id": f"call_{index}", "type": "function"}
            first = {**head, "function": {"name": call.name, "arguments": ""}}
            self._event({"choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
            half = len(arguments) // 2  # arguments arrive in pieces, as vLLM streams them
            for part in (arguments[:half], arguments[half:]):
                chunk = {"index": index, "function": {"arguments": part}}
                self._event({"choices": [{"index": 0, "delta": {"tool_calls": [chunk]}}]})
            sent.tokens += 3
        finish = "tool_calls" if answer.tool_calls else answer.finish_reason
        self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max(1, sent.tokens)}
        self._event({"choices": [], "usage": usage})
        self._done()
        self._count(prompt_tokens, sent.tokens)

    def _messages(self, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        answer = self.scripted.answer_for(_last_user_text(messages))
        prompt_tokens = message_tokens(messages)
        if "max_tokens" not in body:
            self._json(400, {"type": "error", "error": {"message": "max_tokens: Field required"}})
            return
        if self._too_long(prompt_tokens, body.get("max_tokens")):
            return
        self._start_stream()
        start = {"type": "message_start", "message": {"usage": {"input_tokens": prompt_tokens}}}
        self._event(start, "message_start")
        index, tokens = 0, 0
        for kind, text in (("thinking", answer.reasoning), ("text", answer.content)):
            if not text:
                continue
            block = {"type": kind, kind: ""}
            self._event({"type": "content_block_start", "index": index, "content_block": block})
            for piece in _pieces(text):
                self._pause(answer)
                delta = {"type": f"{kind}_delta", kind: piece}
                self._event({"type": "content_block_delta", "index": index, "delta": delta})
                tokens += 1
            self._event({"type": "content_block_stop", "index": index})
            index += 1
        for call in answer.tool_calls:
            self._pause(answer)
            block = {"type": "tool_use", "id": f"toolu_{index}", "name": call.name, "input": {}}
            self._event({"type": "content_block_start", "index": index, "content_block": block})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(call.arguments)}
            self._event({"type": "content_block_delta", "index": index, "delta": delta})
            self._event({"type": "content_block_stop", "index": index})
            index, tokens = index + 1, tokens + 3
        reason = (
            "tool_use"
            if answer.tool_calls
            else {"length": "max_tokens"}.get(answer.finish_reason, "end_turn")
        )
        usage = {"input_tokens": prompt_tokens, "output_tokens": tokens}
        self._event({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": usage})
        self._event({"type": "message_stop"})
        self._finish_chunks()
        self._count(prompt_tokens, tokens)

    def _completions(self, body: dict[str, Any]) -> None:
        prompt = body.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else words(str(prompt))
        max_tokens = int(body.get("max_tokens") or 16)
        if self._too_long(prompt_tokens, max_tokens):
            return
        speeds = self.scripted.speeds
        self._start_stream()
        time.sleep(prompt_tokens * speeds.prefill_per_token)
        token = b'data: {"choices": [{"index": 0, "text": " tok", "finish_reason": null}]}\n\n'
        if speeds.burst:
            time.sleep(max_tokens * speeds.decode_per_token)
            self._chunk(token * max_tokens)
        else:
            for position in range(max_tokens):
                if position:
                    time.sleep(speeds.decode_per_token)
                self._chunk(token)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens}
        self._event({"choices": [], "usage": usage})
        self._done()
        self._count(prompt_tokens, max_tokens)
        self._cache_prefix(prompt if isinstance(prompt, list) else str(prompt).split())

    def _cache_prefix(self, prompt: list[int] | list[str]) -> None:
        """Count the leading full blocks an earlier prompt already had, as vLLM's prefix
        cache does (block size 16), then remember this prompt's blocks."""
        prefixes = [tuple(prompt[:end]) for end in range(16, len(prompt) + 1, 16)]
        with self.scripted.lock:
            hits = 0
            for prefix in prefixes:
                if prefix not in self.scripted.cached_blocks:
                    break
                hits += 16
            self.scripted.cached_blocks.update(prefixes)
            self.scripted.counters.prefix_queried += len(prompt)
            self.scripted.counters.prefix_hits += hits

    # --- helpers ----------------------------------------------------------------------------

    def _too_long(self, prompt_tokens: int, max_tokens: Any) -> bool:
        limit = self.scripted.max_model_len
        wanted = prompt_tokens + (max_tokens if isinstance(max_tokens, int) else 0)
        if prompt_tokens >= limit or wanted > limit:
            message = f"maximum context length is {limit} tokens; the request needs {wanted}"
            self._json(400, {"error": {"message": message, "code": 400}})
            return True
        return False

    def _pause(self, answer: Answer) -> None:
        if answer.token_delay:
            time.sleep(answer.token_delay)

    def _count(self, prompt_tokens: int, tokens: int) -> None:
        counters = self.scripted.counters
        with self.scripted.lock:
            counters.requests += 1
            counters.prompt_tokens += prompt_tokens
            counters.generation_tokens += tokens
            if self.scripted.speculative:
                drafts = max(1, tokens // 3)
                counters.drafts += drafts
                counters.draft_tokens += 3 * drafts
                counters.accepted += 2 * drafts  # a steady 2 of 3 accepted

    def _metrics(self) -> str:
        c = self.scripted.counters
        label = f'{{engine="0",model_name="{self.scripted.model}"}}'
        lines = [
            "# HELP vllm:prompt_tokens_total Prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{label} {float(c.prompt_tokens)}",
            f"vllm:generation_tokens_total{label} {float(c.generation_tokens)}",
            f"vllm:prefix_cache_queries_total{label} {float(c.prefix_queried)}",
            f"vllm:prefix_cache_hits_total{label} {float(c.prefix_hits)}",
        ]
        if self.scripted.speculative:
            lines += [
                f"vllm:spec_decode_num_drafts_total{label} {float(c.drafts)}",
                f"vllm:spec_decode_num_draft_tokens_total{label} {float(c.draft_tokens)}",
                f"vllm:spec_decode_num_accepted_tokens_total{label} {float(c.accepted)}",
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="0"}} '
                f"{float(c.accepted)}",
            ]
        return "\n".join(lines) + "\n"

    def _authorised(self) -> bool:
        expected = self.scripted.api_key
        if expected is None or self.headers.get("Authorization") == f"Bearer {expected}":
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _event(self, payload: dict[str, Any], name: str | None = None) -> None:
        head = f"event: {name or payload.get('type', 'message')}\n" if "type" in payload else ""
        self._chunk(f"{head}data: {json.dumps(payload)}\n\n".encode())

    def _done(self) -> None:
        self._chunk(b"data: [DONE]\n\n")
        self._finish_chunks()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _finish_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _text(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/plain; version=0.0.4")

    def _send(self, status: int, data: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
