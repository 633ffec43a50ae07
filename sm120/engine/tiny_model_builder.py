"""Build a tiny random Llama model that a real vLLM can load: python tiny_model_builder.py DEST

Runs under the ENGINE's Python (torch, transformers, tokenizers), not sm120's, so it
imports nothing from sm120. Weights are random: the model exists to exercise the plumbing
(loading, tokenising, chat template, streaming, metrics), its words are gibberish.
The output is deterministic: same DEST contents on every run.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch  # type: ignore[import-not-found]
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-not-found]
from transformers import (  # type: ignore[import-not-found]
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

SEED = 0
VOCAB_SIZE = 512
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]

# vLLM's CPU attention needs head_dim >= 64 (16 fails at the first request), hence
# hidden 256 over 4 heads.
MODEL_SHAPE = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}

# Read by path (the builder imports nothing from sm120): sm120 rewrites a built model's copy
# when this file changes (tiny_model.refresh_chat_template), so one file is the truth.
CHAT_TEMPLATE = Path(__file__).with_name("tiny_chat_template.jinja").read_text()

CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model can still say hello.
Hello! How are you today? I am fine, thank you. What would you like to know?
The weather is sunny in the morning and rainy in the evening. Please bring an umbrella.
Machine learning models turn text into tokens, and tokens into numbers.
A server listens on a port, answers requests, and writes a line to its log.
You are a helpful assistant. Answer the question in one short sentence.
What is the capital of France? The capital of France is Paris.
Count from one to ten: one, two, three, four, five, six, seven, eight, nine, ten.
The engine starts, loads the weights, warms up, and then reports that it is ready.
Numbers like 0 1 2 3 4 5 6 7 8 9 and 42 or 1024 appear in many documents.
She reads a book in the library while he writes a letter to his friend.
Streaming responses arrive one piece at a time until the last chunk says stop.
Good morning, good afternoon, good evening, and good night to everyone here.
Water boils at one hundred degrees and freezes at zero degrees on the Celsius scale.
Tell me a story about a dragon who learned to cook soup for the whole village.
"""


def train_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeated so that merges have counts to rank by; the trainer is deterministic.
    tokenizer.train_from_iterator(CORPUS.splitlines() * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        chat_template=CHAT_TEMPLATE,
        # Keep decode(encode(text)) == text: no "hello ." -> "hello." clean-up.
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16",
        **MODEL_SHAPE,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def build(dest: Path) -> None:
    if (dest / "config.json").is_file():
        print(f"{dest} already holds a model", file=sys.stderr)
        return
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"{dest} exists, is not empty and holds no config.json: not touching it")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    print("training the byte-level BPE tokenizer", file=sys.stderr)
    tokenizer = train_tokenizer()
    print(f"initialising a random Llama model (vocab {len(tokenizer)})", file=sys.stderr)
    model = build_model(tokenizer)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    if dest.exists():
        dest.rmdir()
    partial.rename(dest)
    print(f"tiny model written to {dest}", file=sys.stderr)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tiny_model_builder.py DEST")
    build(Path(sys.argv[1]).absolute())


if __name__ == "__main__":
    main()
