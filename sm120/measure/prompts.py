"""Benchmark prompts as clients send them: text that the server's tokenizer turns into
exactly the number of tokens asked for.

Text, because a client sends text and the server tokenizes it before the first token can
come back: that work is part of the TTFT a user sees, and `vllm bench serve` sends text
too. On the tiny CPU server the same prompts sent as token ids read 7% (256 tokens) to 10%
(768 tokens) faster TTFT than as text. Exact, because an "8k prompt" should be 8,192
tokens: the text of random ids does not always tokenize back to as many ids, so the ids are
trimmed or topped up until it does.

What the text says matters as much: `sm120 bench` is read against `vllm bench serve
--dataset-name random`, and the server tokenized that tool's text at about 4.2 us a token
against 1.9 us for the ordinary-text tokens we used to send (the tiny model's tokenizer):
several ms of an 8k prompt's TTFT, enough to put the two tools 7% apart on an H100. So
`RandomDatasetPrompts` builds prompts as vLLM's RandomDataset does (vllm/benchmarks/datasets,
the same in vLLM 0.26 and 0.32):
  - ids = allowed[(offset + k) % len(allowed)] for k < input_len - specials, where allowed
    is range(vocab_size) without the special ids, offset a uniform draw from
    range(vocab_size) per prompt (vLLM adds the request's index, a uniform shift too), and
    specials the tokens the server adds itself (a BOS);
  - up to 10 retries of: decode, re-encode without specials, stop at the length, else cut
    the re-encoded ids to it or top them up with uniform ids over range(vocab_size),
    specials included (vllm_text).
vLLM then sends whatever the last retry gave, a token or two long at times (14 in 32 of the
tiny model's 8,192-token prompts); we go on trimming the ids (exact_text), so the length
stays exact. A server whose step budget (max-num-batched-tokens) equals the prompt length
then needs a second step for such a prompt of vLLM's, never for ours.
One difference on purpose: no two prompts of a run start at the same id, so none is served
from the prefix cache (on the tiny model's 506 ids vLLM's own runs collide often).

`TextPrompts` is the older way, kept for servers whose tokenizer files we cannot read: ids
drawn one by one from a pool of ordinary-text tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol

from sm120.measure.load import Prompt, TokenPool
from sm120.measure.vocabulary import Vocabulary
from sm120.server.wire import Wire

ATTEMPTS = 8
VLLM_RETRIES = 10  # gen_prompt_decode_to_target_len's max_retry
# Where vLLM's loop stops short the end of the text is what will not settle: a cut through
# the bytes of one character decodes to U+FFFD, three byte tokens, so the count swings by 2-3.
# Fresh random top-ups get through it: on the tiny tokenizer 8 more tries left 15 of 600
# prompts unsettled, 32 none, and the mean stayed ~6 /tokenize calls a prompt either way.
ATTEMPTS_AFTER_VLLM = 32

Detokenize = Callable[[Sequence[int]], str | None]
Encode = Callable[[str], list[int] | None]


class Tokenizer(Protocol):
    """What making prompts asks of the server (a `Wire` has it)."""

    def tokenize(
        self, model: str, *, prompt: str | None = None, special_tokens: bool = False
    ) -> list[int] | None: ...

    def detokenize(self, model: str, tokens: Sequence[int]) -> str | None: ...


def exact_text(
    ids: Sequence[int],
    length: int,
    detokenize: Detokenize,
    count: Callable[[str], int | None],
    more: Callable[[int], list[int]],
    attempts: int = ATTEMPTS,
) -> str | None:
    """Adjust `ids` until their text counts `length` tokens; None if it does not settle."""
    current = list(ids)
    for _ in range(attempts):
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


def vllm_text(
    ids: Sequence[int],
    length: int,
    detokenize: Detokenize,
    encode: Encode,
    top_up: Callable[[int], list[int]],
) -> tuple[str | None, list[int]]:
    """vLLM's decode / re-encode / cut or top up loop: the text once it encodes to `length`
    ids, else None, with the ids it got to (for exact_text to go on from)."""
    current = list(ids)
    for _ in range(VLLM_RETRIES + 1):
        text = detokenize(current)
        encoded = None if text is None else encode(text)
        if text is None or encoded is None:
            return None, current
        if len(encoded) == length:
            return text, encoded
        if len(encoded) > length:
            current = encoded[:length]
        else:
            current = encoded + top_up(length - len(encoded))
    return None, current


class ConsecutiveIds:
    """The ids of vLLM's random prompts: runs of consecutive allowed ids, each from its own
    random start. No server, no I/O: what makes them vLLM's is tested here alone."""

    def __init__(self, vocabulary: Vocabulary, seed: int) -> None:
        self._size = vocabulary.size
        self._allowed = vocabulary.allowed_ids()
        # Two streams (vLLM draws both from one): where a prompt starts does not hang on how
        # many top-ups the prompts before it needed, so a seed names the same starts.
        self._start_rng = random.Random(seed)
        self._top_up_rng = random.Random(seed + 1)
        self._starts: set[int] = set()

    def run(self, length: int) -> list[int]:
        allowed = self._allowed
        start = self._fresh_start()
        return [allowed[(start + k) % len(allowed)] for k in range(length)]

    def top_up(self, count: int) -> list[int]:
        """As vLLM tops up a prompt that re-encoded short: any id of the vocabulary."""
        return [self._top_up_rng.randrange(self._size) for _ in range(count)]

    def _fresh_start(self) -> int:
        # A start already used would repeat a prompt's first block, a prefix-cache hit.
        if len(self._starts) >= len(self._allowed):
            self._starts.clear()
        while True:
            start = self._start_rng.randrange(self._size) % len(self._allowed)
            if start not in self._starts:
                self._starts.add(start)
                return start


class RandomDatasetPrompts:
    """Exact-length text prompts built as `vllm bench serve --dataset-name random` builds
    them, through the server's /detokenize and /tokenize; a prompt that will not come out
    exact goes out as its token ids (counted in `as_ids`)."""

    def __init__(self, wire: Tokenizer, model: str, ids: ConsecutiveIds, specials: int) -> None:
        self._wire = wire
        self._model = model
        self._ids = ids
        self._specials = specials  # tokens the server adds to a text prompt (a BOS)
        self.as_ids = 0

    def make(self, length: int, count: int) -> list[Prompt]:
        return [self._one(length) for _ in range(count)]

    def _one(self, length: int) -> Prompt:
        whole = self._ids.run(length)
        target = max(1, length - self._specials)
        text, reached = vllm_text(
            whole[:target], target, self._detokenize, self._encode, self._ids.top_up
        )
        if text is None:
            text = exact_text(
                reached,
                target,
                self._detokenize,
                self._count,
                self._ids.top_up,
                attempts=ATTEMPTS_AFTER_VLLM,
            )
        if text is None:
            # As ids the server adds nothing: the whole run is the exact length.
            self.as_ids += 1
            return whole
        return text

    def _detokenize(self, ids: Sequence[int]) -> str | None:
        return self._wire.detokenize(self._model, ids)

    def _encode(self, text: str) -> list[int] | None:
        # Without specials, as vLLM re-encodes: the server adds them to the request itself.
        return self._wire.tokenize(self._model, prompt=text, special_tokens=False)

    def _count(self, text: str) -> int | None:
        encoded = self._encode(text)
        return None if encoded is None else len(encoded)
