"""`--gpus` of `launch`: a count to check the plan against (as before), or a GPU set to place
the engine on: `0,1`, or `device=3` for one GPU (Docker's spelling; a bare `3` is a count)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sm120.core.errors import SM120Error

# What the engine sees of the machine's GPUs; vLLM and SGLang both honour it.
PLACEMENT_ENV = "CUDA_VISIBLE_DEVICES"
DEVICE_PREFIX = "device="
# The biggest machine sm120 plans for has 64 GPUs (sm120.cli.bounds.MAX_GPUS).
MAX_GPU_INDEX = 63
HINT = (
    "a count (--gpus 4) or GPU indexes (--gpus 0,1 or --gpus device=3), as nvidia-smi numbers them"
)


class GpuSetError(SM120Error):
    """A --gpus value that is neither a count nor a set of GPU indexes."""


@dataclass(frozen=True)
class GpuChoice:
    count: int | None = None
    placement: tuple[int, ...] | None = None


def parse_gpus(text: str) -> GpuChoice:
    value = text.strip()
    if "," not in value and not value.startswith(DEVICE_PREFIX):
        try:
            return GpuChoice(count=int(value))
        except ValueError:
            raise GpuSetError(f"--gpus {text!r} is not a count or a list of GPUs", HINT) from None
    return GpuChoice(placement=parse_gpu_set(value.removeprefix(DEVICE_PREFIX), text))


def parse_gpu_set(value: str, shown: str) -> tuple[int, ...]:
    ids: list[int] = []
    for part in value.split(","):
        word = part.strip()
        if not word.isdigit():
            raise GpuSetError(f"--gpus {shown!r}: {word!r} is not a GPU index", HINT)
        index = int(word)
        if index > MAX_GPU_INDEX:
            raise GpuSetError(f"--gpus {shown!r}: GPU {index} is beyond {MAX_GPU_INDEX}", HINT)
        if index in ids:
            raise GpuSetError(f"--gpus {shown!r} names GPU {index} twice", HINT)
        ids.append(index)
    return tuple(ids)


def placement_set(ids: tuple[int, ...]) -> str:
    return ",".join(str(index) for index in ids)


def placed_on(env: Mapping[str, str]) -> tuple[int, ...] | None:
    """The GPU set an engine environment pins it to, or None when it sees every GPU."""
    value = env.get(PLACEMENT_ENV)
    if value is None:
        return None
    try:
        return parse_gpu_set(value, value)
    except GpuSetError:
        return None
