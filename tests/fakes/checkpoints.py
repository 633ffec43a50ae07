"""Small but real checkpoints for the weights tests: safetensors files written per the format
(and, for cross-checks, by the `safetensors` package itself), an index, config and tokenizer
files, plus the kinds of duplicate files model repos carry that the engine does not need."""

from __future__ import annotations

import ctypes
import json
import random
from pathlib import Path

Tensor = tuple[str, list[int], bytes]  # dtype, shape, raw data

INDEX = "model.safetensors.index.json"


def safetensors_bytes(tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """8-byte little-endian header length, JSON header, then the data back to back."""
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the reference writer pads the header to 8 bytes
    return len(text).to_bytes(8, "little") + text + b"".join(t[2] for t in tensors.values())


def library_safetensors_bytes(tensors: dict[str, Tensor]) -> bytes:
    """The same, written by the `safetensors` package (its raw-buffer API needs no torch)."""
    from safetensors import TensorSpec, serialize

    names = {"U8": "uint8", "F32": "float32", "BF16": "bfloat16"}
    buffers = {
        name: ctypes.create_string_buffer(data, len(data)) for name, (_, _, data) in tensors.items()
    }
    specs = {
        name: TensorSpec(
            dtype=names[dtype],
            shape=shape,
            data_ptr=ctypes.addressof(buffers[name]),
            data_len=len(data),
        )
        for name, (dtype, shape, data) in tensors.items()
    }
    return bytes(serialize(specs, metadata={"format": "pt"}))


def shard_tensors(index: int, data_bytes: int, seed: int = 0) -> dict[str, Tensor]:
    rng = random.Random(seed * 1000 + index)
    return {
        f"model.layers.{index}.mlp.weight": ("U8", [data_bytes], rng.randbytes(data_bytes)),
        f"model.layers.{index}.norm.weight": ("F32", [4], rng.randbytes(16)),
    }


def checkpoint(
    shard_data: tuple[int, ...] = (4096, 4096),
    *,
    config: dict[str, object] | None = None,
    writer: object = safetensors_bytes,
) -> dict[str, bytes]:
    """A sharded checkpoint as {relative path: bytes}."""
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for number, data_bytes in enumerate(shard_data, start=1):
        name = f"model-{number:05d}-of-{len(shard_data):05d}.safetensors"
        tensors = shard_tensors(number, data_bytes)
        files[name] = writer(tensors)  # type: ignore[operator]
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(len(t[2]) for t in tensors.values())
    files[INDEX] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}
    ).encode()
    files["config.json"] = json.dumps(
        config or {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}
    ).encode()
    files["generation_config.json"] = b'{"do_sample": false}'
    files["tokenizer.json"] = json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode()
    files["tokenizer_config.json"] = b'{"model_max_length": 4096}'
    files["chat_template.jinja"] = b"{% for m in messages %}{{ m.content }}{% endfor %}"
    return files


# What repos carry that vLLM never reads: other formats of the same weights, docs, plumbing.
UNWANTED: dict[str, bytes] = {
    "pytorch_model.bin": b"\x80\x02pickle" * 64,
    "original/consolidated.00.pth": b"torch-zip" * 64,
    "original/params.json": b'{"dim": 64}',
    "model-q4.gguf": b"GGUF" * 64,
    "README.md": b"# a model card",
    ".gitattributes": b"*.safetensors filter=lfs",
    "inference/model.py": b"print('reference code')",
}


def write_files(folder: Path, files: dict[str, bytes]) -> Path:
    for path, content in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return folder
