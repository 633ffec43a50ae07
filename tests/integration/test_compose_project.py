"""`sm120 compose tiny fast=tiny` for real: the written project brought up by docker-compose
against a real dockerd (two tiny vLLM CPU engines and the gateway, in an image built from
this checkout), a chat to each model through the gateway, and everything gone after `down`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sm120.engine.tiny_model import ensure_tiny_model
from tests.helpers import free_port
from tests.integration import dockerstack
from tests.integration.realstack import sm120

pytestmark = pytest.mark.integration

LOCAL_WHEELS = Path("/opt/wheels")
PROJECT = "sm120composetest"


@pytest.fixture(scope="module")
def docker_host() -> Iterator[str]:
    with dockerstack.docker_session() as host:
        yield host


@pytest.fixture(scope="module")
def home(docker_host: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An sm120 home whose tiny image is built from this checkout (the gateway's code runs
    from it) and whose tiny model exists (the engines mount it read-only)."""
    home = tmp_path_factory.mktemp("compose-home")
    wheels = sorted(LOCAL_WHEELS.glob("torch-*+cpu-*.whl"))
    extra = ["--wheel", str(wheels[-1]), "--build-arg", "TORCH_INDEX_URL="] if wheels else []
    built = sm120(home, "build", "tiny", *extra, "--network", "host", "--json", timeout=3000)
    assert built.returncode == 0, built.stderr[-3000:]
    ensure_tiny_model(Path(os.environ["VLLM_PYTHON"]), home / "models" / "tiny", print)
    return home


def test_compose_project_serves_two_models_through_the_gateway(home: Path, tmp_path: Path) -> None:
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose (Debian package) is installed by .ci/run"
    tiny_port, fast_port, gateway_port = free_port(), free_port(), free_port()
    target = tmp_path / "compose.yaml"
    # This dockerd has no bridge network: every service shares the host's, on loopback.
    written = sm120(
        home,
        *("compose", "tiny", "fast=tiny", "-o", str(target), "--host-network"),
        *("--ports", f"tiny={tiny_port}", "--ports", f"fast={fast_port}"),
        *("--gateway-port", str(gateway_port)),
    )
    assert written.returncode == 0, written.stderr
    keys = {name: (tmp_path / "secrets" / name).read_text() for name in ("gateway_key", "tiny_key")}
    for key in keys.values():
        assert key not in target.read_text() and key not in written.stderr + written.stdout
    base = [compose, "-f", str(target), "-p", PROJECT]
    try:
        up = subprocess.run(
            [*base, "up", "-d"], capture_output=True, text=True, check=False, timeout=600
        )
        assert up.returncode == 0, up.stderr
        with httpx.Client(
            base_url=f"http://127.0.0.1:{gateway_port}",
            headers={"Authorization": f"Bearer {keys['gateway_key']}"},
            timeout=120,
        ) as gateway:
            models = _when_up(gateway, ("tiny", "fast"), timeout_s=1200)
            assert [m["id"] for m in models] == ["fast", "tiny"]
            for model, port in (("tiny", tiny_port), ("fast", fast_port)):
                via_gateway = _chat(gateway, model)
                assert via_gateway["model"] == model
                direct = _direct_chat(port, model, (tmp_path / "secrets" / f"{model}_key"))
                # Greedy decoding: the gateway passes the engine's answer through unchanged.
                assert _content(via_gateway) == _content(direct)
            unknown = gateway.post("/v1/chat/completions", json=_request("nope"))
            assert unknown.status_code == 404
            assert unknown.json()["error"]["models"] == ["fast", "tiny"]
            assert (
                gateway.get("/v1/models", headers={"Authorization": "Bearer no"}).status_code == 401
            )
    finally:
        logs = subprocess.run([*base, "logs", "--tail", "30"], capture_output=True, text=True)
        print(logs.stdout[-6000:])
        subprocess.run([*base, "down", "-v"], capture_output=True, check=False, timeout=300)
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert left.stdout.split() == []
    volumes = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert volumes.stdout.split() == []


def _request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": 0,
    }


def _when_up(gateway: httpx.Client, models: tuple[str, ...], timeout_s: float) -> list[Any]:
    """The gateway's model list once a chat to every model answers (engines load for minutes;
    until then the gateway says 502)."""
    deadline = time.monotonic() + timeout_s
    for model in models:
        while True:
            try:
                answer = gateway.post("/v1/chat/completions", json=_request(model))
            except httpx.TransportError:
                answer = None
            if answer is not None and answer.status_code == 200:
                break
            # 502 while the engine loads; anything else (a 401: keys not wired) fails now.
            assert answer is None or answer.status_code == 502, answer.text
            assert time.monotonic() < deadline, f"{model} never answered through the gateway"
            time.sleep(3)
    listed = gateway.get("/v1/models")
    listed.raise_for_status()
    return list(listed.json()["data"])


def _chat(client: httpx.Client, model: str) -> dict[str, Any]:
    reply = client.post("/v1/chat/completions", json=_request(model))
    reply.raise_for_status()
    return dict(reply.json())


def _direct_chat(port: int, model: str, key_file: Path) -> dict[str, Any]:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as engine:
        # The engine holds its own key (read from the compose secret): none, no answer.
        assert engine.post("/v1/chat/completions", json=_request(model)).status_code == 401
        engine.headers["Authorization"] = f"Bearer {key_file.read_text().strip()}"
        return _chat(engine, model)


def _content(answer: dict[str, Any]) -> str:
    return json.dumps(answer["choices"][0]["message"]["content"])
