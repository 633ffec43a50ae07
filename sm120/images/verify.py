"""Build-time checks of an image's engine environment, run by the Dockerfiles with the
toolkit's Python after the toolkit is in: the engine's packages equal its lock, `pip check`
passes, the engine imports, and torch's CUDA matches the base image's.

    /opt/sm120/venv/bin/python -m sm120.images.verify /opt/sm120/images/CONTEXT [NAME==VER...]

NAME==VER adds what a build installs besides its lock (dsv4's FlashInfer at the recipe's
version); an engine compiled in the image (source: build) is not in its lock either.

Any failure exits non-zero with one line per problem, which fails the build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sm120.images.facts import ENGINE_LOCK, ENGINE_PYTHON_FILE, ImageFacts, load_facts
from sm120.images.lockfile import (
    INVENTORY_SCRIPT,
    canonical,
    inventory_differences,
    parse_lock,
)

_TORCH_CUDA = "import torch; print(torch.version.cuda or '')"


def _engine(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def installed(engine: str) -> dict[str, str]:
    result = _engine([engine, "-c", INVENTORY_SCRIPT])
    if result.returncode != 0:
        raise SystemExit(f"verify: cannot list the engine's packages: {result.stderr.strip()}")
    return {canonical(name): version for name, version in json.loads(result.stdout).items()}


def lock_problems(
    facts: ImageFacts, lock_text: str, have: dict[str, str], extra: dict[str, str] | None = None
) -> list[str]:
    locked = parse_lock(lock_text).pins
    removed = {canonical(name) for name in facts.engine.removed}
    locked = {name: v for name, v in locked.items() if name not in removed}
    locked.update(extra or {})
    if facts.engine.source == "build":
        have = {name: v for name, v in have.items() if name != facts.engine.module}
    return [f"engine lock: {line}" for line in inventory_differences(locked, have)]


def pip_check_problems(engine: str, removed: set[str]) -> list[str]:
    """`pip check` of the engine's environment, with this venv's pip (the engine may have
    none); complaints about packages the image removes on purpose are expected."""
    result = _engine([sys.executable, "-m", "pip", "--python", engine, "check"])
    if result.returncode == 0:
        return []
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    kept = [line for line in lines if not any(f" requires {name}," in line for name in removed)]
    if not lines:
        return [f"pip check: {result.stderr.strip() or 'failed'}"]
    return [f"pip check: {line}" for line in kept]


def cuda_problem(torch_cuda: str, base_cuda: str | None, wants_cuda: bool) -> str | None:
    """torch's CUDA against the base's CUDA_VERSION: same major, and no newer minor than the
    base ships (CUDA runs older minors of its major, never newer ones)."""
    if not wants_cuda:
        return f"torch is a CUDA {torch_cuda} build on a CPU image" if torch_cuda else None
    if not torch_cuda:
        return "torch is a CPU build on a CUDA image"
    if not base_cuda:
        return "the base image sets no CUDA_VERSION to check torch's CUDA against"
    torch_mm = [int(p) for p in torch_cuda.split(".")[:2]]
    base_mm = [int(p) for p in base_cuda.split(".")[:2]]
    if torch_mm[0] != base_mm[0] or torch_mm[1] > base_mm[1]:
        return f"torch is built for CUDA {torch_cuda}, the base image has CUDA {base_cuda}"
    return None


def problems(
    context_dir: Path, engine: str, environ: dict[str, str], extra: dict[str, str]
) -> list[str]:
    facts = load_facts(context_dir)
    lock_text = (context_dir / ENGINE_LOCK).read_text()
    found = lock_problems(facts, lock_text, installed(engine), extra)
    removed = {canonical(name) for name in facts.engine.removed}
    found += pip_check_problems(engine, removed)
    imported = _engine([engine, "-c", f"import {facts.engine.module}"])
    if imported.returncode != 0:
        tail = (imported.stderr.strip().splitlines() or ["no output"])[-1]
        found.append(f"import {facts.engine.module} fails: {tail}")
    torch = _engine([engine, "-c", _TORCH_CUDA])
    if torch.returncode != 0:
        found.append("import torch fails in the engine's environment")
    else:
        problem = cuda_problem(torch.stdout.strip(), environ.get("CUDA_VERSION"), facts.engine.cuda)
        if problem:
            found.append(problem)
    return found


def main(argv: list[str]) -> int:
    pins = [arg.partition("==") for arg in argv[1:]]
    if not argv or any(not sep or not name for name, sep, _ in pins):
        sys.stderr.write("usage: python -m sm120.images.verify CONTEXT_DIR [NAME==VERSION...]\n")
        return 2
    extra = {canonical(name): version for name, _, version in pins}
    engine = Path(ENGINE_PYTHON_FILE).read_text().strip()
    found = problems(Path(argv[0]), engine, dict(os.environ), extra)
    for line in found:
        sys.stderr.write(f"verify: {line}\n")
    if found:
        sys.stderr.write(
            "verify: the engine environment is not the locked one; a moved base or a stale "
            "lock: refresh with 'sm120 build RECIPE --lock' and build again\n"
        )
        return 1
    sys.stderr.write(f"verify: engine environment of {engine} matches its lock\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
