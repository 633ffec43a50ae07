"""Benchmark prompts as clients send them: text that the server's tokenizer turns into
exactly the number of tokens asked for.

Text, because a client sends text and the server tokenizes it before the first token can
come back: that work is part of the TTFT a user sees, and `vllm bench serve` sends text
too. On the tiny CPU server the same prompts sent as token ids read 7% (256 tokens) to 10%
(768 tokens) faster TTFT than as text. Exact, because an "8k prompt" should be 8,192
tokens: the text of random ids does not always tokenize back to as many ids, so the ids are
trimmed or topped up until it does. The ids are drawn one by one from a pool of ordinary-
text tokens, so no two prompts share a prefix the cache could serve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sm120.measure.load import Prompt, TokenPool
from sm120.server.wire import Wire

ATTEMPTS = 8


def exact_text(
    ids: Sequence[int],
    length: int,
    detokenize: Callable[[Sequence[int]], str | None],
    count: Callable[[str], int | None],
    more: Callable[[int], list[int]],
) -> str | None:
    """Adjust `ids` until their text counts `length` tokens; None if it does not settle."""
    current = list(ids)
    for _ in range(ATTEMPTS):
        text = detokenize(current)
        found = None if text is None else count(text)
        if text is None or found is None:
            return None
        if found == length:
            return text
        # One id can come back as several tokens, or several as one: move in proportion.
        step = max(1, abs(found - length) * len(current) // max(found, 1))
        if found > length:
            current = current[: max(1, len(current) - step)]
        else:
            current.extend(more(step))
    return None


class TextPrompts:
    """Makes exact-length text prompts through the server's /detokenize and /tokenize;
    falls back to the token ids (and says how often) when the server cannot."""

    def __init__(self, wire: Wire, model: str, pool: TokenPool) -> None:
        self._wire = wire
        self._model = model
        self._pool = pool
        self.as_ids = 0  # prompts that went out as token ids after all

    def make(self, drawn: Sequence[list[int]], length: int) -> list[Prompt]:
        made: list[Prompt] = []
        for ids in drawn:
            text = exact_text(ids, length, self._detokenize, self._count, self._pool.prompt)
            if text is None:
                self.as_ids += 1
                made.append(ids)
            else:
                made.append(text)
        return made

    def _detokenize(self, ids: Sequence[int]) -> str | None:
        return self._wire.detokenize(self._model, ids)

    def _count(self, text: str) -> int | None:
        # Counted as /v1/completions will count it: with the BOS token the server adds.
        tokens = self._wire.tokenize(self._model, prompt=text, special_tokens=True)
        return None if tokens is None else len(tokens)
