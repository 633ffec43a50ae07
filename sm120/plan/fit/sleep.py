"""Whether host RAM can hold a sleeping model: vLLM's sleep level 1 copies the weights to
host memory and drops the KV cache, so the weights must fit in what the host has free."""

from __future__ import annotations

from pathlib import Path

GIB = 1024**3
# Left to the OS and the engines still awake: a host swapping is slower than a cold start.
HOST_RAM_RESERVE_GIB = 4.0
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def weights_bytes(model_dir: Path) -> int:
    """What the checkpoint's weight files add up to (what level 1 moves to host RAM)."""
    return sum(
        path.stat().st_size
        for path in model_dir.rglob("*")
        if path.suffix in WEIGHT_SUFFIXES and path.is_file()
    )


def sleep_shortfall(
    weights: int, available: int, reserve_gib: float = HOST_RAM_RESERVE_GIB
) -> str | None:
    """Why host RAM cannot hold the sleeping weights, or None when it can."""
    needed = weights + int(reserve_gib * GIB)
    if needed <= available:
        return None
    return (
        f"sleeping needs {weights / GIB:.1f} GiB of host RAM for the weights plus "
        f"{reserve_gib:.0f} GiB kept free, and {available / GIB:.1f} GiB is available"
    )
