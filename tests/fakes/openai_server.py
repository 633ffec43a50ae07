"""A scripted OpenAI-compatible server for client tests (stdlib only, runs in a thread).

It speaks just enough of vLLM's API to exercise client logic: /health, /v1/models and
/v1/chat/completions, streamed or not. Each chat request takes the next scripted `Reply`
(or `default_reply` when the script is empty) and every request body is recorded. Real-vLLM
behaviour is covered by the integration tests, not here.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.loopback_server import LoopbackServer


@dataclass(frozen=True)
class Reply:
    content: str = "READY"
    reasoning: str = ""
    finish_reason: str | None = "stop"
    reasoning_field: str = "reasoning"
    """vLLM's newer name; older vLLM and SGLang use "reasoning_content"."""
    first_delay: float = 0.0
    """Seconds before the first text (after the empty role-only chunk when streaming)."""
    token_delay: float = 0.0
    """Seconds between streamed pieces."""
    completion_tokens: int | None = None
    """Reported usage; defaults to the number of pieces sent."""
    status: int = 200
    error_message: str = "scripted failure"


def split_pieces(text: str) -> list[str]:
    """One streamed piece per word, keeping the whitespace so pieces join back exactly."""
    return re.findall(r"\s*\S+\s*", text) if text.strip() else ([text] if text else [])


class FakeOpenAIServer(LoopbackServer):
    def __init__(
        self, *, api_key: str | None = None, model: str = "fake-model", health_status: int = 200
    ) -> None:
        self.api_key = api_key
        self.model = model
        self.health_status = health_status
        self.default_reply = Reply()
        self.requests: list[dict[str, Any]] = []
        self._script: deque[Reply] = deque()
        self._lock = threading.Lock()
        super().__init__(_handler_for(self))

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    def next_reply(self) -> Reply:
        with self._lock:
            return self._script.popleft() if self._script else self.default_reply

    def record(self, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(body)


def _handler_for(server: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_FakeHandler):
        fake = server

    return Handler


class _FakeHandler(BaseHTTPRequestHandler):
    fake: FakeOpenAIServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest output clean

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send_json(self.fake.health_status, {})
        elif self.path == "/v1/models":
            if self._authorised():
                self._send_json(200, {"object": "list", "data": [{"id": self.fake.model}]})
        else:
            self._send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            self._send_json(404, {"detail": "Not Found"})
            return
        if not self._authorised():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.fake.record(body)
        reply = self.fake.next_reply()
        if reply.status != 200:
            error = {"object": "error", "message": reply.error_message, "code": reply.status}
            self._send_json(reply.status, error)
        elif body.get("stream"):
            self._stream(reply, body)
        else:
            time.sleep(reply.first_delay)
            self._send_json(200, _completion(reply, body["model"]))

    def _authorised(self) -> bool:
        expected = self.fake.api_key
        if expected is None or self.headers.get("Authorization") == f"Bearer {expected}":
            return True
        self._send_json(401, {"error": "Unauthorized"})
        return False

    def _stream(self, reply: Reply, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        model = body["model"]
        self._event(_chunk(model, {"role": "assistant", "content": ""}))
        time.sleep(reply.first_delay)
        pieces = [(reply.reasoning_field, p) for p in split_pieces(reply.reasoning)]
        pieces += [("content", p) for p in split_pieces(reply.content)]
        for position, (name, text) in enumerate(pieces):
            if position:
                time.sleep(reply.token_delay)
            self._event(_chunk(model, {name: text}))
        self._event(_chunk(model, {}, reply.finish_reason))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({"choices": [], "usage": _usage(reply)})
        self._write(b"data: [DONE]\n\n")

    def _event(self, payload: dict[str, Any]) -> None:
        self._write(f"data: {json.dumps(payload)}\n\n".encode())

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self._write(data)


def _usage(reply: Reply) -> dict[str, int]:
    sent = len(split_pieces(reply.reasoning)) + len(split_pieces(reply.content))
    tokens = sent if reply.completion_tokens is None else reply.completion_tokens
    return {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens}


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"object": "chat.completion.chunk", "model": model, "choices": [choice]}


def _completion(reply: Reply, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    message[reply.reasoning_field] = reply.reasoning or None
    choice = {"index": 0, "message": message, "finish_reason": reply.finish_reason}
    return {
        "object": "chat.completion",
        "model": model,
        "choices": [choice],
        "usage": _usage(reply),
    }
