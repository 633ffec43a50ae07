"""Exact-length text prompts: the trim / top-up loop against tokenizers with known habits."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import pytest

from sm120.measure.prompts import ATTEMPTS, exact_text
from sm120.server.client import BadServerResponse
from sm120.server.wire import Wire


def spelled(ids: Sequence[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


def more(count: int) -> list[int]:
    return list(range(500, 500 + count))


def test_text_that_already_counts_right_is_kept() -> None:
    calls: list[int] = []

    def count(text: str) -> int:
        calls.append(1)
        return len(text.split())

    assert exact_text(range(10), 10, spelled, count, more) == spelled(range(10))
    assert len(calls) == 1


def test_ids_that_split_into_more_tokens_are_trimmed_to_the_length() -> None:
    # every id divisible by 3 comes back as two tokens, as a byte-level token may
    def count(text: str) -> int:
        return sum(2 if int(word[1:]) % 3 == 0 else 1 for word in text.split())

    text = exact_text(range(300), 256, spelled, count, more)
    assert text is not None and count(text) == 256


def test_ids_that_merge_into_fewer_tokens_are_topped_up() -> None:
    # pairs of neighbouring ids merge into one token
    def count(text: str) -> int:
        return (len(text.split()) + 1) // 2

    text = exact_text(range(100), 120, spelled, count, more)
    assert text is not None and count(text) == 120


def test_a_length_the_tokenizer_cannot_reach_gives_up() -> None:
    tried: list[str] = []

    def even(text: str) -> int:  # every count comes out even: 7 is never reached
        tried.append(text)
        return 2 * len(text.split())

    assert exact_text(range(5), 7, spelled, even, more) is None
    assert len(tried) == ATTEMPTS


def test_a_server_without_detokenize_gives_up_at_once() -> None:
    counted: list[str] = []
    assert exact_text(range(5), 5, lambda _ids: None, counted.append, more) is None  # type: ignore[arg-type,func-returns-value]
    assert counted == []


def test_a_detokenize_answer_without_text_is_a_bad_response() -> None:
    wire = Wire("http://127.0.0.1:9", None)
    wire._http = httpx.Client(
        base_url=wire.base_url,
        transport=httpx.MockTransport(lambda _request: httpx.Response(200, json={"x": 1})),
    )
    with pytest.raises(BadServerResponse, match="/detokenize answered without a 'prompt'"):
        wire.detokenize("m", [1, 2])
