"""Random (dummy) weights for the GPU proof's planner runs, with the one post-load step vLLM's
dummy loader skips.

vLLM 0.26's dummy loader fills every parameter with random values but never calls the model's
`load_weights`, where DeepSeek-V4 derives its mHC broadcast weights
(`finalize_mhc_broadcast_weights`); the first forward pass then fails
`assert self.hc_attn_fn_broadcast is not None`. With SM120_DUMMY_POST_LOAD=1 and this folder
first on PYTHONPATH, every Python process of the engine (the API server, the engine core and
the workers, which vLLM spawns once CUDA is initialised) runs that step after the dummy fill,
for models that have it. Nothing else changes: the KV cache is the engine's own.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

TARGET = "vllm.model_executor.model_loader.dummy_loader"
POST_LOAD_STEPS = ("finalize_mhc_broadcast_weights",)


def _patch(module: ModuleType) -> None:
    loader_class: Any = module.DummyModelLoader
    fill = loader_class.load_weights

    def load_weights(self: Any, model: Any, model_config: Any) -> None:
        fill(self, model, model_config)
        inner = getattr(model, "model", None)
        for name in POST_LOAD_STEPS:
            step = getattr(inner, name, None)
            if callable(step):
                step()

    loader_class.load_weights = load_weights


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches the dummy loader as it is imported, so no process imports vLLM early."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return original.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                original.exec_module(module)
                _patch(module)

        spec.loader = _Loader()
        return spec


if os.environ.get("SM120_DUMMY_POST_LOAD") == "1":
    sys.meta_path.insert(0, _PatchOnImport())
