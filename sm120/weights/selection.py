"""Which files of a model repo the engine needs.

vLLM loads safetensors shards through the index, plus the config, tokenizer and chat template
files, and the Python modules of `--trust-remote-code` models. Repos often carry the same
weights again in other formats (PyTorch .bin, GGUF, Meta's `original/` consolidated files):
skipping them can halve a 300 GB download.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatch

# fnmatch's '*' also matches '/', so these apply in sub-folders too.
ALLOW_PATTERNS: tuple[str, ...] = (
    "*.safetensors",  # weights (and the index: see *.json)
    "*.json",  # config, generation config, quantization config, tokenizer, index
    "*.jinja",  # chat templates kept outside tokenizer_config.json
    "*.model",  # sentencepiece tokenizer.model
    "*.tiktoken",  # tiktoken vocabularies
    "*.txt",  # merges.txt, vocab.txt
    "*.py",  # configuration_*.py / modeling_*.py for --trust-remote-code
)
IGNORE_PATTERNS: tuple[str, ...] = (
    "original/*",  # Meta-format duplicates of the weights
    "*/original/*",
    "inference/*",  # reference inference code and its configs (DeepSeek repos)
    ".*",  # .gitattributes and other repo plumbing
    "*/.*",
)


# Mistral-format duplicates, skipped when the repo also has the Hugging Face layout.
DUPLICATE_WEIGHTS = "consolidated*.safetensors"
HF_LAYOUT = ("model.safetensors.index.json", "model.safetensors")


def needed(path: str) -> bool:
    return any(fnmatch(path, p) for p in ALLOW_PATTERNS) and not any(
        fnmatch(path, p) for p in IGNORE_PATTERNS
    )


def needed_files(paths: Iterable[str]) -> list[str]:
    chosen = [path for path in paths if needed(path)]
    if any(name in chosen for name in HF_LAYOUT):
        chosen = [path for path in chosen if not fnmatch(path, DUPLICATE_WEIGHTS)]
    return chosen
