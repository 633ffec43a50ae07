"""Values read from the checkpoint: the DSA `index_topk_pattern` (F09).

vLLM decides per layer whether the sparse-attention indexer computes its own top-k ("F") or
reuses the previous layer's ("S") from `index_topk_pattern`, falling back to
`index_topk_freq` / `index_skip_topk_offset`. It never reads the checkpoint's `indexer_types`,
so a GLM-5.2 checkpoint that only carries `indexer_types` silently runs every layer as full
and long-context output turns to garbage. We derive the pattern and pass it explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.bounded import MIB, read_json_capped
from sm120.core.errors import PlanError, SM120Error

# A checkpoint's config.json is a few KB; bounded in case the folder holds something else.
MAX_CONFIG_BYTES = 16 * MIB
_CONFIG_HINT = "re-download the checkpoint"
_TYPE_TO_CHAR = {"full": "F", "shared": "S"}
# vLLM's default when the config omits index_skip_topk_offset (vllm_facts.md §1.1).
_DEFAULT_SKIP_OFFSET = 2


@dataclass(frozen=True)
class IndexTopkPattern:
    pattern: str
    source: str  # which config field it came from
    num_hidden_layers: int

    @property
    def full_layers(self) -> int:
        return self.pattern.count("F")

    @property
    def skip_layers(self) -> int:
        """Layers that reuse top-k: the number of 'skip sparse MLA indexer' boot lines (F09)."""
        return self.pattern.count("S")


def read_config(model_dir: Path) -> dict[str, Any] | None:
    path = model_dir / "config.json"
    if not path.is_file():
        return None
    try:
        data = read_json_capped(path, MAX_CONFIG_BYTES, "checkpoint config", _CONFIG_HINT)
    except SM120Error as exc:
        raise PlanError(exc.message, exc.hint) from None
    if not isinstance(data, dict):
        raise PlanError(f"{path} is not a JSON object", "re-download the checkpoint")
    return data


def _layer_count(config: dict[str, Any]) -> int:
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or layers <= 0:
        raise PlanError(
            "config.json has no positive num_hidden_layers",
            "point --model-dir at the checkpoint folder that holds the model's config.json",
        )
    return layers


def _from_indexer_types(types: list[Any]) -> str:
    chars = []
    for position, kind in enumerate(types):
        char = _TYPE_TO_CHAR.get(str(kind).lower())
        if char is None:
            raise PlanError(
                f"config.json indexer_types[{position}] is '{kind}', expected 'full' or 'shared'",
                "this checkpoint uses an indexer layout sm120 does not know",
            )
        chars.append(char)
    return "".join(chars)


def _from_frequency(layers: int, freq: int, offset: int) -> str:
    # The same arithmetic vLLM applies when no pattern is given.
    return "".join(
        "S" if max(layer - offset + 1, 0) % freq != 0 else "F" for layer in range(layers)
    )


def derive_index_topk_pattern(config: dict[str, Any]) -> IndexTopkPattern:
    layers = _layer_count(config)
    explicit = config.get("index_topk_pattern")
    types = config.get("indexer_types")
    freq = config.get("index_topk_freq")
    if isinstance(explicit, str) and explicit:
        pattern, source = explicit, "index_topk_pattern"
    elif isinstance(types, list) and types:
        pattern, source = _from_indexer_types(types), "indexer_types"
    elif isinstance(freq, int) and freq > 0:
        offset = config.get("index_skip_topk_offset", _DEFAULT_SKIP_OFFSET)
        pattern = _from_frequency(layers, freq, int(offset))
        source = f"index_topk_freq={freq}, index_skip_topk_offset={offset}"
    else:
        raise PlanError(
            "config.json has neither indexer_types nor index_topk_freq, so the sparse-attention "
            "layer pattern cannot be derived (F09)",
            "check that --model-dir holds a DSA checkpoint such as GLM-5.2",
        )
    if len(pattern) != layers:
        raise PlanError(
            f"derived index_topk_pattern has {len(pattern)} layers but num_hidden_layers is "
            f"{layers} (from {source})",
            "the checkpoint's config.json is inconsistent; re-download it",
        )
    return IndexTopkPattern(pattern=pattern, source=source, num_hidden_layers=layers)


def hf_overrides_with_pattern(existing: Any, derived: IndexTopkPattern) -> dict[str, Any]:
    """Merge the pattern into --hf-overrides. `use_index_cache` is sent too: older builds
    gate the pattern behind it and newer ones ignore it (vllm_facts.md §1.1)."""
    merged: dict[str, Any] = dict(existing) if isinstance(existing, dict) else {}
    merged["use_index_cache"] = True
    merged["index_topk_pattern"] = derived.pattern
    return merged
