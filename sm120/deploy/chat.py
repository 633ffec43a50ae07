"""A chat with the running deployment: one question, or a multi-turn session."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from rich.console import Console

from sm120.core.net import client_url
from sm120.core.terminal import terminal_safe
from sm120.engine.find import find_deployment
from sm120.engine.secrets import read_api_key
from sm120.server.client import ChatResult, ServerClient


@dataclass
class ChatSession:
    client: ServerClient
    model: str
    thinking: bool | None
    max_tokens: int | None
    stream: bool
    history: list[dict[str, str]] = field(default_factory=list)
    err: Console = field(default_factory=lambda: Console(stderr=True))

    @classmethod
    def for_deployment(
        cls,
        name: str | None,
        *,
        system: str | None,
        thinking: bool | None,
        max_tokens: int | None,
        stream: bool,
    ) -> ChatSession:
        state = find_deployment(name)
        client = ServerClient(
            client_url(state.host, state.port), read_api_key(state.api_key_file), timeout=600.0
        )
        history = [{"role": "system", "content": system}] if system else []
        return cls(client, state.served_model_name, thinking, max_tokens, stream, history)

    def _on_delta(self, kind: str, text: str) -> None:
        text = terminal_safe(text)
        if kind == "reasoning":
            # Reasoning goes to stderr, dimmed: stdout carries only the answer.
            self.err.print(text, style="dim", end="", highlight=False, markup=False)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    def ask(self, prompt: str) -> ChatResult:
        self.history.append({"role": "user", "content": prompt})
        result = self.client.chat(
            self.history,
            self.model,
            max_tokens=self.max_tokens,
            thinking=self.thinking,
            stream=self.stream,
            on_delta=self._on_delta if self.stream else None,
        )
        if not self.stream:
            if result.reasoning:
                self.err.print(
                    terminal_safe(result.reasoning), style="dim", highlight=False, markup=False
                )
            sys.stdout.write(terminal_safe(result.content))
        sys.stdout.write("\n")
        self.history.append({"role": "assistant", "content": result.content})
        self._stats(result)
        return result

    def _stats(self, result: ChatResult) -> None:
        parts = []
        if result.ttft_s is not None:
            parts.append(f"TTFT {result.ttft_s:.2f}s")
        if result.decode_tps is not None:
            parts.append(f"decode {result.decode_tps:.1f} tok/s")
        if result.completion_tokens is not None:
            parts.append(f"{result.completion_tokens} tokens")
        if result.finish_reason == "length" and not result.content.strip():
            parts.append(
                "empty answer: reasoning used the whole budget (F12), raise "
                "--max-tokens or use --no-think"
            )
        if parts:
            self.err.print("[" + ", ".join(parts) + "]", style="dim", highlight=False, markup=False)

    def interactive(self) -> None:
        self.err.print(f"chatting with {self.model} - empty line or Ctrl-D ends", style="dim")
        while True:
            try:
                line = input("> ").strip()
            except (EOFError, KeyboardInterrupt):
                break
            if not line:
                break
            self.ask(line)
