"""`sm120 launch --runtime docker` against a real dockerd, with a container whose engine prints
a real fatal start-up and hangs (tests/fakes/standin_engine.py installed as vLLM's API server): the
launch ends in seconds, names the failure, exits 2 and leaves no container behind."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.standin import FAILURE_LINE, FATAL_STARTUPS, STANDIN, make_model_dir
from tests.helpers import free_port
from tests.integration import dockerstack
from tests.integration.realstack import sm120, state_of

pytestmark = pytest.mark.integration

NAME = "failfast-standin"
LABEL = f"sm120.deployment={NAME}"
DOCKERFILE = f"""FROM {dockerstack.BASE_IMAGE}
COPY vllm /opt/standin/vllm
COPY startup.log /opt/standin/startup.log
ENV PYTHONPATH=/opt/standin
"""


@pytest.fixture(scope="module")
def docker_host() -> Iterator[str]:
    saved = os.environ.get("DOCKER_HOST")
    with dockerstack.running_dockerd() as host:
        os.environ["DOCKER_HOST"] = host
        try:
            dockerstack.ensure_base_image()
            yield host
        finally:
            if saved is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = saved


def image_ref(home: Path, args: list[str]) -> str:
    """The image this launch would run: the dry run prints it."""
    planned = sm120(home, "launch", "tiny", *args, "--dry-run")
    assert planned.returncode == 0, planned.stderr
    found = re.search(r"^image\s+(\S+)", planned.stdout, re.MULTILINE)
    assert found, planned.stdout
    return found[1]


def build_standin_image(ref: str, log: Path, context: Path) -> None:
    """An image whose `python3 -m vllm.entrypoints.openai.api_server` is the stand-in."""
    server = context / "vllm" / "entrypoints" / "openai"
    server.mkdir(parents=True)
    for package in (server, server.parent, server.parent.parent):
        (package / "__init__.py").write_text("")
    shutil.copy(STANDIN, server / "api_server.py")
    shutil.copy(log, context / "startup.log")
    (context / "Dockerfile").write_text(DOCKERFILE)
    built = subprocess.run(
        ["docker", "-H", dockerstack.docker_host(), "build", "-q", "-t", ref, str(context)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr


def test_a_lost_start_in_a_container_ends_in_seconds(docker_host: str, tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    args = [
        "--runtime", "docker", "--network", "host", "--name", NAME, "--port", str(port),
        "--model-dir", str(make_model_dir(tmp_path)), "--timeout", "120",
    ]  # fmt: skip
    ref = image_ref(home, args)
    build_standin_image(ref, FATAL_STARTUPS / "vllm_0.32.0_cpu_no_cxx_compiler.log", tmp_path)
    try:
        started = time.monotonic()
        launched = sm120(home, "launch", "tiny", *args, "--no-monitor", timeout=300)
        seconds = time.monotonic() - started
        assert launched.returncode == 2, launched.stderr[-3000:]
        last = launched.stderr.strip().splitlines()[-1]
        found = FAILURE_LINE.fullmatch(last)
        assert found, last
        # The stand-in takes a few seconds to print its 326 lines (0.05 s apart).
        assert int(found[1]) < 40
        assert found[2] == "compiling"
        assert found[3].startswith(
            "RuntimeError: Worker failed with error 'InvalidCxxCompiler: No working C++ compiler"
        )
        assert found[4] == "see the log lines above"
        assert seconds < 90, f"took {seconds:.0f} s"
        assert dockerstack.containers_with(LABEL) == []
        assert state_of(home, NAME) is None
    finally:
        dockerstack.remove_containers(LABEL)
        subprocess.run(
            ["docker", "-H", dockerstack.docker_host(), "rmi", "-f", ref],
            capture_output=True,
            check=False,
        )
