"""The real vLLM source for patch tests, and a way to run single functions out of it.

vLLM itself is not installed in the test environment (it needs torch and CUDA), so the
source comes from the released wheel (`pip download vllm==X --no-deps`), unpacked once per
machine into ~/.cache/sm120/vllm-src/<version>/vllm/...  Only the .py files are kept.

Tests then compile one function from a (patched) module with `ast` and run it against
stand-ins for the handful of names it uses, so a patch's behaviour is checked without
importing vLLM.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

DONE_MARKER = ".complete"


def source_cache_root() -> Path:
    override = os.environ.get("SM120_VLLM_SRC_CACHE")
    return Path(override) if override else Path.home() / ".cache/sm120/vllm-src"


def vllm_source(version: str) -> Path:
    """The directory holding `vllm/` of the released `version`, fetched on first use."""
    root = source_cache_root() / version
    if (root / DONE_MARKER).exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".{version}-") as scratch:
        work = Path(scratch)
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps"),
                *("--only-binary=:all:", "--quiet", "-d", str(work / "wheel")),
            ],
            check=True,
            timeout=1800,
        )
        (wheel,) = (work / "wheel").glob("vllm-*.whl")
        tree = work / "tree"
        with zipfile.ZipFile(wheel) as archive:
            members = [n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(".py")]
            archive.extractall(tree, members=members)
        (tree / DONE_MARKER).write_text(f"vllm {version} from {wheel.name}\n")
        # Another test run may have finished first; its copy is as good as ours.
        if not (root / DONE_MARKER).exists():
            shutil.rmtree(root, ignore_errors=True)
            tree.rename(root)
    return root


def class_method(source: Path, class_name: str, method: str) -> ast.FunctionDef:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == method:
                    return item  # type: ignore[return-value]
    raise LookupError(f"{class_name}.{method} not found in {source}")


def module_function(source: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"{name} not found in {source}")


def compile_function(node: ast.FunctionDef, namespace: dict[str, Any]) -> Any:
    """Define the function in `namespace` (its globals) without annotations or decorators,
    which would need vLLM's types, and return it."""
    node.decorator_list = []
    node.returns = None
    arguments = node.args
    for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
        arg.annotation = None
    for arg in (arguments.vararg, arguments.kwarg):
        if arg is not None:
            arg.annotation = None
    module = ast.Module(body=[node], type_ignores=[])
    ast.fix_missing_locations(module)
    exec(compile(module, f"<{node.name}>", "exec"), namespace)  # the vLLM release's own code
    return namespace[node.name]


def init_assignment(source: Path, class_name: str, attribute: str) -> Any:
    """The literal value `self.<attribute>` is set to in `class_name.__init__`."""
    init = class_method(source, class_name, "__init__")
    for node in ast.walk(init):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == attribute
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    return node.value
    raise LookupError(f"self.{attribute} not assigned in {class_name}.__init__ of {source}")
