"""The served tokenizer's vocabulary, read from its own files: what benchmark prompts span.

`vllm bench serve --dataset-name random` builds prompts from runs of consecutive ids over
`tokenizer.vocab_size` with `tokenizer.all_special_ids` left out. For a fast Hugging Face
tokenizer those are the base vocabulary of tokenizer.json (added tokens not counted: that is
`get_vocab_size(with_added_tokens=False)`) and the ids of the special tokens that
tokenizer_config.json names. The same two facts are read here from the same files, without
transformers (sm120 does not depend on it). Not config.json's `vocab_size`: that is the
embedding table, often padded past the last id the tokenizer knows (Qwen: 151,936 rows for
151,643 base ids), and vLLM's prompts never reach those rows.

The server cannot tell us: vLLM's /tokenize answers ids, a count and max_model_len, and its
/tokenizer_info is off unless the server was started with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
# The attributes transformers gathers into all_special_tokens.
NAMED_SPECIALS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
LISTED_SPECIALS = ("additional_special_tokens", "extra_special_tokens")


@dataclass(frozen=True)
class Vocabulary:
    size: int
    """The base vocabulary: ids 0 .. size-1, as `tokenizer.vocab_size` counts them."""
    special_ids: frozenset[int]
    source: str
    """The tokenizer.json it was read from: the report says where the figure came from."""

    def allowed_ids(self) -> list[int]:
        """The ids a random prompt is built from, in order: vLLM's `allowed_tokens`."""
        return [i for i in range(self.size) if i not in self.special_ids]


def find_vocabulary(folders: Iterable[str | None]) -> Vocabulary | None:
    """The vocabulary of the first folder that holds a readable tokenizer.json. Absolute
    paths only: a relative one is a Hub repo id ("Qwen/Qwen3-8B") or relative to the
    server's working directory, and a folder of that name here is not what it loaded."""
    for folder in folders:
        if folder and Path(folder).is_absolute():
            found = read_vocabulary(Path(folder))
            if found is not None:
                return found
    return None


def read_vocabulary(folder: Path) -> Vocabulary | None:
    """None when the folder has no usable tokenizer.json (a slow or custom tokenizer, a
    folder inside a container, a Hub repo id): the caller falls back and says so."""
    tokenizer = _json_object(folder / TOKENIZER_FILE) or {}
    model = tokenizer.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, (dict, list)):
        return None
    added = tokenizer.get("added_tokens")
    ids = _ids_by_token(vocab, added)
    named = {ids[token] for token in _named_specials(folder) if token in ids}
    found = Vocabulary(
        size=len(vocab),
        special_ids=frozenset(named or _flagged_specials(added)),
        source=str(folder / TOKENIZER_FILE),
    )
    # A run of consecutive ids needs somewhere to run.
    return found if len(found.allowed_ids()) >= 2 else None


def _json_object(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def _ids_by_token(vocab: dict[str, Any] | list[Any], added: Any) -> dict[str, int]:
    ids: dict[str, int] = {}
    if isinstance(vocab, dict):
        ids.update((token, i) for token, i in vocab.items() if isinstance(i, int))
    else:  # Unigram: [piece, score] pairs, the id is the place in the list
        ids.update((entry[0], i) for i, entry in enumerate(vocab) if _is_piece(entry))
    for entry in added if isinstance(added, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int):
            ids[str(entry.get("content"))] = entry["id"]
    return ids


def _is_piece(entry: Any) -> bool:
    return isinstance(entry, list) and bool(entry) and isinstance(entry[0], str)


def _named_specials(folder: Path) -> list[str]:
    tokens: list[str] = []
    for name in CONFIG_FILES:
        config = _json_object(folder / name) or {}
        for key in NAMED_SPECIALS:
            tokens.extend(_token_texts(config.get(key)))
        for key in LISTED_SPECIALS:
            listed = config.get(key)
            # transformers 5 may write extra_special_tokens as {name: token}
            values = list(listed.values()) if isinstance(listed, Mapping) else listed
            for value in values if isinstance(values, list) else []:
                tokens.extend(_token_texts(value))
    return tokens


def _token_texts(value: Any) -> list[str]:
    """A special token as the config writes it: the text, or an AddedToken's fields."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return [value["content"]]
    return []


def _flagged_specials(added: Any) -> set[int]:
    """For a tokenizer.json without a config naming its specials: the added tokens it marks
    special (the set transformers ends up with for the tokenizers in use)."""
    entries = added if isinstance(added, list) else []
    return {
        entry["id"]
        for entry in entries
        if isinstance(entry, dict)
        and entry.get("special") is True
        and isinstance(entry.get("id"), int)
    }
