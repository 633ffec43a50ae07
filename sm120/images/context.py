"""The build context sm120 sends to Docker: an in-memory tar, byte-identical for identical
inputs so Docker's layer cache and our build hash both see real changes only."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sm120.core.errors import SM120Error
from sm120.images.facts import ENGINE_LOCK, FACTS_FILE, TOOLKIT_DIR

# What every image carries besides its own context: the package (for the container
# entrypoint and `sm120 info` inside), the recipes, and launch/. They travel under one folder
# so a Dockerfile takes them with a single COPY (each layer is a full copy on vfs storage).
SHARED_PATHS = ("pyproject.toml", "README.md", "sm120", "launch", "recipes")
PAYLOAD_DIR = "sm120-payload"
SKIPPED_PARTS = {"__pycache__", "_bundled", ".mypy_cache", ".ruff_cache"}
WHEELS_DIR = "wheels"


class BuildContextError(SM120Error):
    """The build context cannot be assembled."""


def source_root() -> Path:
    """The checkout sm120 runs from; images are built from its sources."""
    root = Path(__file__).resolve().parent.parent.parent
    if not (root / "images").is_dir() or not (root / "pyproject.toml").is_file():
        raise BuildContextError(
            "building images needs the sm120 source checkout (images/, launch/, pyproject.toml)",
            "clone the sm120 repository and install it with 'pip install -e .'",
        )
    return root


@dataclass(frozen=True)
class BuildContext:
    tar: bytes
    dockerfile: str
    files: tuple[str, ...]
    digest: str


def _walk(root: Path, relative: str) -> Iterator[tuple[str, Path]]:
    path = root / relative
    if path.is_file():
        yield relative, path
        return
    for child in sorted(path.rglob("*")):
        if child.is_file() and not SKIPPED_PARTS.intersection(child.relative_to(root).parts):
            if child.suffix in (".pyc", ".pyo"):
                continue
            yield child.relative_to(root).as_posix(), child


def _entries(root: Path, context: str, wheels: Iterable[Path]) -> list[tuple[str, Path]]:
    context_dir = root / "images" / context
    if not (context_dir / "Dockerfile").is_file():
        raise BuildContextError(
            f"images/{context}/Dockerfile does not exist",
            "the recipe's image.context must name a folder under images/",
        )
    entries = [
        (f"{PAYLOAD_DIR}/{name}", path) for rel in SHARED_PATHS for name, path in _walk(root, rel)
    ]
    entries += list(_walk(root, f"images/{context}"))
    # The toolkit's locks and installer, and what the image's checks read at build time.
    entries += [(f"{PAYLOAD_DIR}/{name}", path) for name, path in _walk(root, TOOLKIT_DIR)]
    entries += [
        (f"{PAYLOAD_DIR}/images/{context}/{name}", context_dir / name)
        for name in (FACTS_FILE, ENGINE_LOCK)
        if (context_dir / name).is_file()
    ]
    for wheel in sorted(wheels):
        if not wheel.is_file() or wheel.suffix != ".whl":
            raise BuildContextError(f"{wheel} is not a wheel file", "pass .whl files to --wheel")
        entries.append((f"images/{context}/{WHEELS_DIR}/{wheel.name}", wheel))
    return sorted(dict(entries).items())


def build_context(
    context: str, wheels: Iterable[Path] = (), generated: Mapping[str, bytes] | None = None
) -> BuildContext:
    """The tar Docker builds from. `generated` files (the manifest) go into the payload folder
    but not into the digest: they describe the build rather than define it."""
    root = source_root()
    entries: list[tuple[str, Path | bytes]] = list(_entries(root, context, wheels))
    entries += [(f"{PAYLOAD_DIR}/{name}", data) for name, data in (generated or {}).items()]
    buffer = io.BytesIO()
    digest = hashlib.sha256()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, source in entries:
            data = source if isinstance(source, bytes) else source.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            # Fixed metadata: the same files always give the same bytes.
            info.mtime = 0
            executable = isinstance(source, Path) and source.stat().st_mode & 0o100
            info.mode = 0o755 if executable else 0o644
            tar.addfile(info, io.BytesIO(data))
            # Wheels are how a pinned package is delivered, not what the image is: a build
            # with and without them carries the same content.
            if isinstance(source, Path) and f"/{WHEELS_DIR}/" not in name:
                digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return BuildContext(
        tar=buffer.getvalue(),
        dockerfile=f"images/{context}/Dockerfile",
        files=tuple(name for name, _ in entries),
        digest=digest.hexdigest(),
    )
