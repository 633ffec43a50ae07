"""The tokenizer's vocabulary read from its files, as transformers (and so `vllm bench serve`)
reads `vocab_size` and `all_special_ids`.

The expected figures of the first two layouts were checked against transformers 5.19 through
vLLM 0.32's get_tokenizer on tokenizers saved the same way (a Llama-2-like tokenizer with its
specials inside the base vocabulary, a Qwen-like one with them all added after it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sm120.measure.vocabulary import find_vocabulary, read_vocabulary


def bpe(tokens: list[str]) -> dict[str, int]:
    return {token: i for i, token in enumerate(tokens)}


def write(folder: Path, tokenizer: dict[str, Any], config: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def added(id_: int, content: str, special: bool) -> dict[str, Any]:
    return {"id": id_, "content": content, "special": special}


def test_specials_inside_the_base_vocabulary_are_left_out(tmp_path: Path) -> None:
    # Llama-2's layout: <unk> <s> </s> are ids 0-2 of the base vocabulary
    tokens = ["<unk>", "<s>", "</s>", *(f"p{i}" for i in range(7))]
    tokenizer = {
        "model": {"type": "BPE", "vocab": bpe(tokens)},
        "added_tokens": [
            added(0, "<unk>", True),
            added(1, "<s>", True),
            added(2, "</s>", True),
            added(10, "<extra>", True),
            added(11, "plain", False),
        ],
    }
    config = {
        # an AddedToken as older transformers wrote it
        "bos_token": {"__type": "AddedToken", "content": "<s>", "special": True},
        "eos_token": "</s>",
        "unk_token": "<unk>",
    }
    found = read_vocabulary(write(tmp_path, tokenizer, config))
    assert found is not None
    # added tokens are not in vocab_size; only named specials count as special
    assert (found.size, sorted(found.special_ids)) == (10, [0, 1, 2])
    assert found.allowed_ids() == list(range(3, 10))
    assert found.source == str(tmp_path / "tokenizer.json")


def test_specials_added_after_the_base_vocabulary_leave_it_whole(tmp_path: Path) -> None:
    # Qwen's layout, with transformers 5's extra_special_tokens and a special it never names
    tokenizer = {
        "model": {"type": "BPE", "vocab": bpe([f"p{i}" for i in range(6)])},
        "added_tokens": [
            added(6, "<|endoftext|>", True),
            added(7, "<|im_start|>", True),
            added(8, "<|im_end|>", True),
            added(9, "<think>", False),
            added(10, "<|unnamed|>", True),
        ],
    }
    config = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "extra_special_tokens": ["<|im_start|>"],
    }
    found = read_vocabulary(write(tmp_path, tokenizer, config))
    assert found is not None
    assert (found.size, sorted(found.special_ids)) == (6, [6, 7, 8])
    assert found.allowed_ids() == list(range(6))


def test_config_json_padding_is_not_the_vocabulary(tmp_path: Path) -> None:
    folder = write(tmp_path, {"model": {"type": "BPE", "vocab": bpe(["a", "b", "c"])}}, {})
    (folder / "config.json").write_text(json.dumps({"vocab_size": 64}))
    found = read_vocabulary(folder)
    assert found is not None and found.size == 3


def test_unigram_vocabularies_are_lists_and_unnamed_specials_fall_back_to_flags(
    tmp_path: Path,
) -> None:
    pieces = [["<pad>", 0.0], ["</s>", 0.0], ["a", -1.0], ["b", -2.0]]
    tokenizer = {
        "model": {"type": "Unigram", "vocab": pieces},
        "added_tokens": [added(0, "<pad>", True), added(1, "</s>", True)],
    }
    # no tokenizer_config.json: the tokens the file itself marks special
    found = read_vocabulary(write(tmp_path, tokenizer))
    assert found is not None
    assert (found.size, sorted(found.special_ids)) == (4, [0, 1])
    assert found.allowed_ids() == [2, 3]


def test_a_vocabulary_of_one_usable_id_is_refused(tmp_path: Path) -> None:
    tokenizer = {
        "model": {"type": "BPE", "vocab": bpe(["<s>", "a"])},
        "added_tokens": [added(0, "<s>", True)],
    }
    assert read_vocabulary(write(tmp_path, tokenizer)) is None


def test_the_first_folder_with_a_readable_tokenizer_wins(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not json")
    slow = tmp_path / "slow"  # a sentencepiece model only: nothing to read here
    slow.mkdir()
    (slow / "tokenizer.model").write_bytes(b"\x00")
    good = write(tmp_path / "good", {"model": {"type": "BPE", "vocab": bpe(["a", "b"])}})
    folders = [None, "/no/such/folder", str(tmp_path / "broken"), str(slow), str(good)]
    found = find_vocabulary(folders)
    assert found is not None and found.source == str(good / "tokenizer.json")
    assert find_vocabulary(folders[:-1]) is None


def test_a_relative_root_is_not_looked_up_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what /v1/models gives as the root of a model served from the Hub
    write(tmp_path / "Qwen" / "Qwen3-8B", {"model": {"type": "BPE", "vocab": bpe(["a", "b"])}})
    monkeypatch.chdir(tmp_path)
    assert read_vocabulary(Path("Qwen/Qwen3-8B")) is not None  # the folder is readable
    assert find_vocabulary(["Qwen/Qwen3-8B"]) is None
