"""For each GPU image: its toolkit stage, taken verbatim from its Dockerfile, built on the
stand-in base used for the tiny image (the real bases need NVIDIA's registries), cannot change
the engine's environment. The stand-in's "engine" holds the huggingface_hub that vLLM 0.15.1's
transformers needs (< 1.0) where the GPU image keeps its engine; the toolkit's lock wants 2.x.
Every file of the engine's site-packages is hashed before and after the stage."""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Iterator

import pytest

from sm120.engine.docker_api import build_image
from sm120.images.context import build_context
from sm120.images.facts import load_facts
from tests.helpers import REPO
from tests.integration import dockerstack

pytestmark = pytest.mark.integration

GPU_CONTEXTS = ("glm47", "glm52", "dsv4", "dsv4-sglang")
ENGINE_HUB = "0.36.2"
# Every file under the engine interpreter's site-packages, with its hash.
SNAPSHOT = (
    "import hashlib, pathlib, site\n"
    "for root in sorted(set(site.getsitepackages())):\n"
    "    for path in sorted(pathlib.Path(root).rglob('*')):\n"
    "        if path.is_file():\n"
    "            print(hashlib.sha256(path.read_bytes()).hexdigest(), path)\n"
)


@pytest.fixture(scope="module")
def docker_host() -> Iterator[str]:
    with dockerstack.docker_session() as host:
        yield host


def _toolkit_segment(context: str) -> str:
    text = (REPO / "images" / context / "Dockerfile").read_text()
    start = text.index("# --- toolkit:")
    return text[start : text.index("# --- end toolkit ---", start)]


def _test_dockerfile(context: str) -> str:
    engine = load_facts(REPO / "images" / context).engine.python
    # A venv engine (/opt/venv/bin/python) is made as such; python3 is the system one.
    make_engine = (
        f"RUN python3 -m venv {engine.rsplit('/bin/', 1)[0]}\n" if engine.startswith("/") else ""
    )
    py = engine if engine.startswith("/") else "python3"
    return (
        f"FROM {dockerstack.BASE_IMAGE}\n"
        f"{make_engine}"
        f"RUN {py} -m pip install --no-cache-dir huggingface-hub=={ENGINE_HUB} pyyaml==6.0.1\n"
        "COPY snapshot.py /tmp/snapshot.py\n"
        f"RUN {py} /tmp/snapshot.py > /tmp/engine-before\n"
        f"{_toolkit_segment(context)}"
        f"RUN {py} /tmp/snapshot.py > /tmp/engine-after\n"
    )


def _context_with(context: str, dockerfile: str) -> bytes:
    tar_bytes = io.BytesIO(build_context(context).tar)
    with tarfile.open(fileobj=tar_bytes, mode="a") as tar:
        for name, text in (("toolkit-test.Dockerfile", dockerfile), ("snapshot.py", SNAPSHOT)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return tar_bytes.getvalue()


def _in_image(image: str, *argv: str) -> str:
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", argv[0], image, *argv[1:]],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip


@pytest.mark.parametrize("context", GPU_CONTEXTS)
def test_toolkit_stage_leaves_the_engine_environment_untouched(
    docker_host: str, context: str
) -> None:
    tag = f"sm120-test/toolkit-{context}:latest"
    log: list[str] = []
    build_image(
        _context_with(context, _test_dockerfile(context)),
        dockerfile="toolkit-test.Dockerfile",
        tag=tag,
        buildargs={},
        labels={"sm120.test": "toolkit"},
        network_mode="host",
        no_cache=False,
        progress=log.append,
    )
    engine = load_facts(REPO / "images" / context).engine.python
    before = _in_image(tag, "cat", "/tmp/engine-before")
    after = _in_image(tag, "cat", "/tmp/engine-after")
    assert "huggingface_hub" in before
    assert before == after, "the toolkit stage changed a file in the engine's site-packages"
    version = "import huggingface_hub; print(huggingface_hub.__version__)"
    assert _in_image(tag, engine, "-c", version).strip() == ENGINE_HUB
    toolkit_hub = _in_image(tag, "/opt/sm120/venv/bin/python", "-c", version).strip()
    assert int(toolkit_hub.split(".")[0]) >= 1
    # the engine is driven by the absolute path the stage recorded
    recorded = _in_image(tag, "cat", "/opt/sm120/engine-python").strip()
    assert recorded.startswith("/")
    assert recorded == _in_image(tag, "sh", "-c", f"command -v {engine}").strip()
    plan = _in_image(
        tag, "/opt/sm120/venv/bin/python", "-c", "import sm120.plan.resolve; print('ok')"
    )
    assert plan.strip() == "ok"
