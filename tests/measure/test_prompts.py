"""Exact-length text prompts: the trim / top-up loops against tokenizers with known habits,
and the runs of consecutive ids that `vllm bench serve`'s random dataset builds prompts from."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import pytest

from sm120.measure.prompts import (
    ATTEMPTS,
    ATTEMPTS_AFTER_VLLM,
    VLLM_RETRIES,
    ConsecutiveIds,
    RandomDatasetPrompts,
    exact_text,
    vllm_text,
)
from sm120.measure.vocabulary import Vocabulary
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


# --- prompts built as vLLM's random dataset builds them --------------------------------------


def vocabulary(size: int, specials: Sequence[int] = (0, 1)) -> Vocabulary:
    return Vocabulary(size, frozenset(specials), "tokenizer.json")


def test_a_prompt_is_a_run_of_consecutive_allowed_ids_that_wraps() -> None:
    run = ConsecutiveIds(vocabulary(12, (0, 1, 5)), seed=1).run(25)
    allowed = [2, 3, 4, 6, 7, 8, 9, 10, 11]
    start = allowed.index(run[0])
    assert run == [allowed[(start + k) % len(allowed)] for k in range(25)]


def test_no_two_prompts_start_alike_until_every_start_was_used() -> None:
    ids = ConsecutiveIds(vocabulary(12), seed=3)
    firsts = [ids.run(4)[0] for _ in range(10)]
    assert sorted(firsts) == list(range(2, 12))
    assert len(ids.run(4)) == 4  # then the starts are free again


def test_top_ups_draw_from_the_whole_vocabulary_specials_included() -> None:
    assert set(ConsecutiveIds(vocabulary(6), seed=0).top_up(500)) == set(range(6))


def split_small_multiples_of_three(text: str) -> list[int]:
    """t0, t3, t6 ... each re-encode as two ids of 1000 and up, which stay as they are."""
    ids: list[int] = []
    for word in text.split():
        i = int(word[1:])
        ids.extend([i + 1000, i + 2000] if i < 1000 and i % 3 == 0 else [i])
    return ids


def test_vllm_text_cuts_the_re_encoded_ids() -> None:
    encoded: list[str] = []

    def encode(text: str) -> list[int]:
        encoded.append(text)
        return split_small_multiples_of_three(text)

    text, ids = vllm_text(range(300), 256, spelled, encode, more)
    assert text is not None and len(split_small_multiples_of_three(text)) == 256
    assert len(ids) == 256 and len(encoded) == 2
    # vLLM keeps the first 256 ids of the re-encoding (t0 became t1000 t2000), not the ids
    # it sent in
    assert text.startswith("t1000 t2000 t1 t2 t1003 t2003 t4")


def test_vllm_text_tops_up_a_text_that_encodes_short() -> None:
    # ids under 10 come back as nothing, as a padded embedding row would
    def encode(text: str) -> list[int]:
        return [int(word[1:]) for word in text.split() if int(word[1:]) >= 10]

    asked: list[int] = []

    def top_up(count: int) -> list[int]:
        asked.append(count)
        return more(count)

    text, _ = vllm_text(range(100), 100, spelled, encode, top_up)
    assert asked == [10]
    assert text == spelled([*range(10, 100), *range(500, 510)])


def test_vllm_text_gives_up_after_its_retries_with_the_ids_it_reached() -> None:
    tried: list[str] = []

    def doubled(text: str) -> list[int]:  # every word two ids: 7 is never reached
        tried.append(text)
        return [int(word[1:]) for word in text.split() for _ in range(2)]

    text, ids = vllm_text(range(5), 7, spelled, doubled, more)
    assert text is None
    assert len(tried) == VLLM_RETRIES + 1
    # the last re-encoding, cut to the length: where exact_text goes on from
    assert ids == doubled(tried[-1])[:7]


def test_vllm_text_stops_at_once_without_detokenize() -> None:
    tried: list[str] = []
    text, ids = vllm_text([4, 5], 2, lambda _ids: None, lambda t: tried.append(t) or [], more)
    assert (text, ids, tried) == (None, [4, 5], [])


class ToyServer:
    """A tokenizer with merges, as the server's /tokenize and /detokenize would answer: pieces
    of one or two letters, the longest match first, special tokens spelled out in text
    parsed as themselves (as Hugging Face tokenizers do), and a BOS when asked for."""

    PIECES = ("<s>", "</s>", *"abcdefgh", "ab", "cd", "ef", "gh", "ha")

    def __init__(self, odd_counts: bool = True) -> None:
        self.odd_counts = odd_counts

    def tokenize(
        self, model: str, *, prompt: str | None = None, special_tokens: bool = False
    ) -> list[int] | None:
        text, ids = prompt or "", [0] if special_tokens else []
        while text:
            piece = max((p for p in self.PIECES if text.startswith(p)), key=len)
            ids.append(self.PIECES.index(piece))
            text = text[len(piece) :]
        if not self.odd_counts and len(ids) % 2:
            ids.append(ids[-1])
        return ids

    def detokenize(self, model: str, tokens: Sequence[int]) -> str | None:
        return "".join(self.PIECES[token] for token in tokens)


def test_random_dataset_prompts_count_exactly_as_the_server_counts_them() -> None:
    toy = ToyServer()
    ids = ConsecutiveIds(vocabulary(len(ToyServer.PIECES)), seed=7)
    twin = ConsecutiveIds(vocabulary(len(ToyServer.PIECES)), seed=7)  # foresees the runs
    maker = RandomDatasetPrompts(toy, "m", ids, specials=1)
    for length in (5, 16, 33, 64):
        for prompt in maker.make(length, 3):
            run = twin.run(length)
            assert isinstance(prompt, str)
            # with the BOS the server adds, exactly the length asked for
            assert len(toy.tokenize("m", prompt=prompt, special_tokens=True) or []) == length
            # what is cut or topped up is the end: the start is the run of consecutive ids
            assert prompt.startswith(toy.detokenize("m", run[: length - 1]) or "-")
    assert maker.as_ids == 0


def test_a_prompt_that_never_comes_out_exact_goes_out_as_its_run_of_ids() -> None:
    counted: list[str] = []

    class Counting(ToyServer):
        def tokenize(
            self, model: str, *, prompt: str | None = None, special_tokens: bool = False
        ) -> list[int] | None:
            counted.append(prompt or "")
            return super().tokenize(model, prompt=prompt, special_tokens=special_tokens)

    toy = Counting(odd_counts=False)
    ids = ConsecutiveIds(vocabulary(len(ToyServer.PIECES)), seed=2)
    twin = ConsecutiveIds(vocabulary(len(ToyServer.PIECES)), seed=2)
    maker = RandomDatasetPrompts(toy, "m", ids, specials=0)
    assert maker.make(9, 1) == [twin.run(9)]
    assert maker.as_ids == 1
    # vLLM's tries, then the longer trimming that follows them
    assert len(counted) == VLLM_RETRIES + 1 + ATTEMPTS_AFTER_VLLM


def test_where_vllms_loop_stops_short_of_the_length_the_trimming_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sm120.measure import prompts

    # vLLM would send these a token or two off; the bench needs them exact
    monkeypatch.setattr(prompts, "vllm_text", lambda ids, *_args: (None, list(ids)))
    toy = ToyServer()
    maker = RandomDatasetPrompts(toy, "m", ConsecutiveIds(vocabulary(15), seed=4), specials=1)
    made = maker.make(40, 3)
    assert all(isinstance(prompt, str) for prompt in made)
    counts = [len(toy.tokenize("m", prompt=str(p), special_tokens=True) or []) for p in made]
    assert counts == [40, 40, 40] and maker.as_ids == 0
