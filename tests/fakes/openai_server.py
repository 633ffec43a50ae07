"""The fake OpenAI-compatible server every client, gateway, gate and bench test talks to
(stdlib only, served from a thread on a free loopback port).

A chat request takes the next scripted `Reply` (`script`), else the reply of the first rule
whose regex matches the last user message (`when`), like a model that knows the answers,
else `default_reply`. Replies carry content, reasoning and tool calls, on
/v1/chat/completions (streamed or not) and /v1/messages (always streamed), at a scripted pace.
It also speaks the parts of vLLM the benchmarks use: /v1/completions with text or token-id
prompts at a scripted prefill and decode speed, /tokenize (one token per word) and
/detokenize (one word per token), /v1/models with root and max_model_len, /health, and
/metrics counters, including speculative-decoding drafts when asked to (a subclass may
report other figures there). Every POST is recorded as (path, body), and every request's
Authorization header. Real-vLLM behaviour is covered by the integration tests, not here.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from tests.fakes.loopback_server import LoopbackServer
from tests.fakes.openai_handler import handler_for


@dataclass(frozen=True)
class ScriptedTool:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ScriptedTool, ...] = ()
    finish_reason: str | None = "stop"
    reasoning_field: str = "reasoning"
    """vLLM's newer name; older vLLM and SGLang use "reasoning_content"."""
    first_delay: float = 0.0
    """Seconds before the first text (after the empty role-only chunk when streaming)."""
    token_delay: float = 0.0
    """Seconds between streamed pieces."""
    completion_tokens: int | None = None
    """Reported usage; defaults to the number of pieces sent (3 for each tool call)."""
    status: int = 200
    error_message: str = "scripted failure"


@dataclass
class Rule:
    pattern: str
    reply: Reply


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


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client closing its keep-alive connection is not news


@dataclass
class _Script:
    queue: deque[Reply] = field(default_factory=deque)
    rules: list[Rule] = field(default_factory=list)


class FakeOpenAIServer(LoopbackServer):
    def __init__(
        self,
        *,
        api_key: str | None = None,
        model: str = "fake-model",
        health_status: int = 200,
        max_model_len: int = 4096,
        speculative: bool = False,
        address: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        self.api_key = api_key
        self.model = model
        self.health_status = health_status
        self.max_model_len = max_model_len
        self.speculative = speculative
        self.default_reply = Reply(content="READY")
        self.speeds = Speeds()
        self.counters = Counters()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.authorizations: list[str | None] = []
        """The Authorization header of every request, in order."""
        self.lock = threading.Lock()
        self.cached_blocks: set[tuple[int | str, ...]] = set()
        """Prompts seen (ids, or words for text), as every 16-token block prefix."""
        self.detokenizes = True
        """False: answer /detokenize with 404, as a server without the endpoint."""
        self.adds_bos = False
        """True: a text prompt gets one more token, a BOS, where vLLM would add it (a
        completion, a /tokenize asked for special tokens)."""
        self._script = _Script()
        super().__init__(handler_for(self), _QuietServer, address=address)

    def script(self, *replies: Reply) -> None:
        """Answer the next chat requests with `replies`, in order, whatever they ask."""
        with self.lock:
            self._script.queue.extend(replies)

    def when(self, pattern: str, reply: Reply) -> FakeOpenAIServer:
        """Answer a last user message matching `pattern` with `reply`."""
        self._script.rules.append(Rule(pattern, reply))
        return self

    def reply_for(self, text: str) -> Reply:
        with self.lock:
            if self._script.queue:
                return self._script.queue.popleft()
        for rule in self._script.rules:
            if re.search(rule.pattern, text, re.IGNORECASE):
                return rule.reply
        return self.default_reply

    def record(self, path: str, body: dict[str, Any]) -> None:
        with self.lock:
            self.requests.append((path, body))

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """The bodies of the /v1/chat/completions requests, in order."""
        with self.lock:
            return [body for path, body in self.requests if path == "/v1/chat/completions"]

    def count(self, prompt_tokens: int, tokens: int) -> None:
        with self.lock:
            self.counters.requests += 1
            self.counters.prompt_tokens += prompt_tokens
            self.counters.generation_tokens += tokens
            if self.speculative:
                drafts = max(1, tokens // 3)
                self.counters.drafts += drafts
                self.counters.draft_tokens += 3 * drafts
                self.counters.accepted += 2 * drafts  # a steady 2 of 3 accepted

    def cache_prefix(self, prompt: list[int] | list[str]) -> None:
        """Count the leading full blocks an earlier prompt already had, as vLLM's prefix
        cache does (block size 16), then remember this prompt's blocks."""
        prefixes = [tuple(prompt[:end]) for end in range(16, len(prompt) + 1, 16)]
        with self.lock:
            hits = 0
            for prefix in prefixes:
                if prefix not in self.cached_blocks:
                    break
                hits += 16
            self.cached_blocks.update(prefixes)
            self.counters.prefix_queried += len(prompt)
            self.counters.prefix_hits += hits

    def metrics_text(self) -> str:
        c = self.counters
        label = f'{{engine="0",model_name="{self.model}"}}'
        lines = [
            "# HELP vllm:prompt_tokens_total Prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{label} {float(c.prompt_tokens)}",
            f"vllm:generation_tokens_total{label} {float(c.generation_tokens)}",
            f"vllm:prefix_cache_queries_total{label} {float(c.prefix_queried)}",
            f"vllm:prefix_cache_hits_total{label} {float(c.prefix_hits)}",
        ]
        if self.speculative:
            lines += [
                f"vllm:spec_decode_num_drafts_total{label} {float(c.drafts)}",
                f"vllm:spec_decode_num_draft_tokens_total{label} {float(c.draft_tokens)}",
                f"vllm:spec_decode_num_accepted_tokens_total{label} {float(c.accepted)}",
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="0"}} '
                f"{float(c.accepted)}",
            ]
        return "\n".join(lines) + "\n"
