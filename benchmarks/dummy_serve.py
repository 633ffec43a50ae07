"""`vllm serve` for random (dummy) weights, with the one post-load step the dummy loader skips.

Run by the engine's Python: `python benchmarks/dummy_serve.py serve MODEL --load-format dummy
...`. vLLM 0.26's dummy loader fills every parameter with random values but never calls the
model's `load_weights`, where DeepSeek-V4 derives its mHC broadcast weights
(`finalize_mhc_broadcast_weights`); the first forward pass then fails an assertion. This
wrapper runs that step after the dummy fill, for models that have it, and changes nothing
else: the KV cache the engine allocates is the engine's own. The engine core and workers
are forked (VLLM_WORKER_MULTIPROC_METHOD=fork), so they inherit the patched loader.
"""

from __future__ import annotations

import os
import sys
from typing import Any

POST_LOAD_STEPS = ("finalize_mhc_broadcast_weights",)


def patch_dummy_loader() -> None:
    from vllm.model_executor.model_loader import dummy_loader  # type: ignore[import-not-found]

    fill = dummy_loader.DummyModelLoader.load_weights

    def load_weights(self: Any, model: Any, model_config: Any) -> None:
        fill(self, model, model_config)
        inner = getattr(model, "model", None)
        for name in POST_LOAD_STEPS:
            step = getattr(inner, name, None)
            if callable(step):
                step()

    dummy_loader.DummyModelLoader.load_weights = load_weights


def main() -> None:
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    patch_dummy_loader()
    from vllm.entrypoints.cli.main import main as vllm_main  # type: ignore[import-not-found]

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
