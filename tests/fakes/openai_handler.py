"""The request handler of tests/fakes/openai_server.py: routing, the endpoints, and the event
streams as vLLM writes them (HTTP/1.1 chunks, one write per piece)."""

from __future__ import annotations

import json
import re
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.openai_server import FakeOpenAIServer, Reply


BOS_ID = 1


def handler_for(server: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        fake = server

    return Handler


def split_pieces(text: str) -> list[str]:
    """One streamed piece per word, keeping the whitespace so pieces join back exactly."""
    return re.findall(r"\s*\S+\s*", text) if text.strip() else ([text] if text else [])


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


class _Pace:
    """Sleeps before each streamed piece: `first_delay` before the first, then `token_delay`."""

    def __init__(self, reply: Reply) -> None:
        self._reply = reply
        self.sent = 0

    def next(self) -> None:
        delay = self._reply.token_delay if self.sent else self._reply.first_delay
        if delay:
            time.sleep(delay)
        self.sent += 1


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAIServer
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn does

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest output clean

    def setup(self) -> None:
        super().setup()
        # Streamed pieces must leave one by one, as a real server's do: without this, Nagle's
        # algorithm holds small writes back until the client's delayed ACK (~40 ms).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # --- routing ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self.fake.authorizations.append(self.headers.get("Authorization"))
        if self.path == "/health":
            self._json(self.fake.health_status, {})
        elif self.path == "/v1/models":
            if self._authorised():
                entry = {
                    "id": self.fake.model,
                    "root": f"/models/{self.fake.model}",
                    "max_model_len": self.fake.max_model_len,
                }
                self._json(200, {"object": "list", "data": [entry]})
        elif self.path == "/metrics":
            self._send(200, self.fake.metrics_text().encode(), "text/plain; version=0.0.4")
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        self.fake.authorizations.append(self.headers.get("Authorization"))
        self.fake.record(self.path, body)
        if self.path == "/tokenize":
            self._tokenize(body)
            return
        if self.path == "/detokenize":
            self._detokenize(body)
            return
        if self.path not in ("/v1/chat/completions", "/v1/messages", "/v1/completions"):
            self._json(404, {"detail": "Not Found"})
        elif not self._authorised():
            return
        elif self.path == "/v1/chat/completions":
            self._chat(body)
        elif self.path == "/v1/messages":
            self._messages(body)
        else:
            self._completions(body)

    # --- endpoints --------------------------------------------------------------------------

    def _tokenize(self, body: dict[str, Any]) -> None:
        if "messages" in body:
            count = message_tokens(body["messages"])
        else:
            count = words(str(body.get("prompt", "")))
        # Ids stand for words: 1000 + a hash bucket, so pools built from them are varied.
        ids = [1000 + (i * 7919) % 5000 for i in range(count)]
        if "messages" not in body and self.fake.adds_bos and body.get("add_special_tokens", True):
            ids, count = [BOS_ID, *ids], count + 1
        self._json(200, {"count": count, "max_model_len": self.fake.max_model_len, "tokens": ids})

    def _detokenize(self, body: dict[str, Any]) -> None:
        if not self.fake.detokenizes:
            self._json(404, {"detail": "Not Found"})
            return
        self._json(200, {"prompt": " ".join(f"w{token}" for token in body.get("tokens") or [])})

    def _chat(self, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        reply = self.fake.reply_for(_last_user_text(messages))
        prompt_tokens = message_tokens(messages)
        if reply.status != 200:
            error = {"object": "error", "message": reply.error_message, "code": reply.status}
            self._json(reply.status, error)
            return
        if self._too_long(prompt_tokens, body.get("max_tokens")):
            return
        if body.get("stream"):
            tokens = self._chat_stream(reply, body, prompt_tokens)
        else:
            time.sleep(reply.first_delay)
            tokens = _tokens_of(reply)
            self._json(200, _completion(reply, body["model"], prompt_tokens, tokens))
        self.fake.count(prompt_tokens, tokens)

    def _chat_stream(self, reply: Reply, body: dict[str, Any], prompt_tokens: int) -> int:
        model = body["model"]
        self._start_stream()
        self._event(_chunk(model, {"role": "assistant", "content": ""}))
        pace = _Pace(reply)
        pieces = [(reply.reasoning_field, p) for p in split_pieces(reply.reasoning)]
        pieces += [("content", p) for p in split_pieces(reply.content)]
        for name, text in pieces:
            pace.next()
            self._event(_chunk(model, {name: text}))
        for index, call in enumerate(reply.tool_calls):
            pace.next()
            arguments = json.dumps(call.arguments)
            head = {"index": index, "id": f"call_{index}", "type": "function"}
            first = {**head, "function": {"name": call.name, "arguments": ""}}
            self._event(_chunk(model, {"tool_calls": [first]}))
            half = len(arguments) // 2  # arguments arrive in pieces, as vLLM streams them
            for part in (arguments[:half], arguments[half:]):
                piece = {"index": index, "function": {"arguments": part}}
                self._event(_chunk(model, {"tool_calls": [piece]}))
        finish = "tool_calls" if reply.tool_calls else reply.finish_reason
        self._event(_chunk(model, {}, finish))
        tokens = _tokens_of(reply)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}
            self._event({"choices": [], "usage": usage})
        self._done()
        return tokens

    def _messages(self, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        reply = self.fake.reply_for(_last_user_text(messages))
        prompt_tokens = message_tokens(messages)
        if "max_tokens" not in body:
            self._json(400, {"type": "error", "error": {"message": "max_tokens: Field required"}})
            return
        if self._too_long(prompt_tokens, body.get("max_tokens")):
            return
        self._start_stream()
        start = {"type": "message_start", "message": {"usage": {"input_tokens": prompt_tokens}}}
        self._event(start, "message_start")
        index, pace = 0, _Pace(reply)
        for kind, text in (("thinking", reply.reasoning), ("text", reply.content)):
            if not text:
                continue
            block = {"type": kind, kind: ""}
            self._event({"type": "content_block_start", "index": index, "content_block": block})
            for piece in split_pieces(text):
                pace.next()
                delta = {"type": f"{kind}_delta", kind: piece}
                self._event({"type": "content_block_delta", "index": index, "delta": delta})
            self._event({"type": "content_block_stop", "index": index})
            index += 1
        for call in reply.tool_calls:
            pace.next()
            block = {"type": "tool_use", "id": f"toolu_{index}", "name": call.name, "input": {}}
            self._event({"type": "content_block_start", "index": index, "content_block": block})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(call.arguments)}
            self._event({"type": "content_block_delta", "index": index, "delta": delta})
            self._event({"type": "content_block_stop", "index": index})
            index += 1
        reason = (
            "tool_use"
            if reply.tool_calls
            else {"length": "max_tokens"}.get(str(reply.finish_reason), "end_turn")
        )
        tokens = _tokens_of(reply)
        usage = {"input_tokens": prompt_tokens, "output_tokens": tokens}
        self._event({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": usage})
        self._event({"type": "message_stop"})
        self._finish_chunks()
        self.fake.count(prompt_tokens, tokens)

    def _completions(self, body: dict[str, Any]) -> None:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt_tokens = len(prompt)
        else:
            prompt_tokens = words(str(prompt)) + (1 if self.fake.adds_bos else 0)
        max_tokens = int(body.get("max_tokens") or 16)
        if self._too_long(prompt_tokens, max_tokens):
            return
        speeds = self.fake.speeds
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
        self.fake.count(prompt_tokens, max_tokens)
        self.fake.cache_prefix(prompt if isinstance(prompt, list) else str(prompt).split())

    # --- helpers ----------------------------------------------------------------------------

    def _too_long(self, prompt_tokens: int, max_tokens: Any) -> bool:
        limit = self.fake.max_model_len
        wanted = prompt_tokens + (max_tokens if isinstance(max_tokens, int) else 0)
        if prompt_tokens >= limit or wanted > limit:
            message = f"maximum context length is {limit} tokens; the request needs {wanted}"
            self._json(400, {"error": {"message": message, "code": 400}})
            return True
        return False

    def _authorised(self) -> bool:
        expected = self.fake.api_key
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

    def _send(self, status: int, data: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def _tokens_of(reply: Reply) -> int:
    """What usage reports: the scripted count, else the pieces sent (3 per tool call)."""
    if reply.completion_tokens is not None:
        return reply.completion_tokens
    sent = len(split_pieces(reply.reasoning)) + len(split_pieces(reply.content))
    return sent + 3 * len(reply.tool_calls)


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"object": "chat.completion.chunk", "model": model, "choices": [choice]}


def _completion(reply: Reply, model: str, prompt_tokens: int, tokens: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    message[reply.reasoning_field] = reply.reasoning or None
    choice = {"index": 0, "message": message, "finish_reason": reply.finish_reason}
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": tokens,
        "total_tokens": prompt_tokens + tokens,
    }
    return {"object": "chat.completion", "model": model, "choices": [choice], "usage": usage}
