"""The gateway's sleep/wake swap on a real CUDA vLLM (`pytest -m gpu` on a GPU machine; CI
and the CPU machines skip it, saying why: vLLM's sleep mode needs CUDA's memory pool).

Two GPU tiny deployments with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 behind a
gateway with room for one: asking for the second puts the first to sleep (weights to host
RAM, KV cache dropped) and wakes the second; the wake must take at most 10% of a cold start.
Both are warded: their dev-mode routes answer on their unix sockets only (the gateway's, and
this test's as the operator), never on their ports.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port
from tests.integration.realstack import sm120

pytestmark = pytest.mark.gpu

SLEEPY = ("--set", "enable-sleep-mode=true", "--set", "env.VLLM_SERVER_DEV_MODE=1")


def _chat(url: str, key: str, model: str) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    began = time.monotonic()
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=600,
    )
    assert answer.status_code == 200, answer.text
    return time.monotonic() - began


def _on_socket(home: Path, name: str) -> httpx.Client:
    """A client of the deployment's engine itself, on the unix socket its state names."""
    state = json.loads((home / "deployments" / name / "state.json").read_text())
    assert state["engine_socket"], "the deployment is not warded"
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=state["engine_socket"]), base_url="http://e"
    )


def test_the_gateway_swaps_by_sleep_and_wake(tmp_path: Path) -> None:
    from sm120.engine.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(Path(os.environ["VLLM_PYTHON"]), tmp_path / "tiny", print)
    home = tmp_path / "home"
    ports = {"gpu-a": free_port(), "gpu-b": free_port()}
    cold: dict[str, float] = {}
    try:
        for name, port in ports.items():
            began = time.monotonic()
            launched = sm120(
                home, "launch", "tiny", "-V", "gpu", "--name", name, *SLEEPY,
                "--set", f"model.served_name={name}", "--port", str(port),
                "--model-dir", str(model), "--no-monitor",
                "--vllm-python", os.environ["VLLM_PYTHON"],
            )  # fmt: skip
            assert launched.returncode == 0, launched.stderr[-3000:]
            cold[name] = time.monotonic() - began
        # The ward keeps the dev-mode routes off the port; the engine's socket has them.
        refused = httpx.post(f"http://127.0.0.1:{ports['gpu-b']}/sleep?level=1", timeout=30)
        assert refused.status_code == 404, refused.text
        engines = {name: _on_socket(home, name) for name in ports}
        # As an operator would before the night: gpu-b sleeps, gpu-a serves.
        slept = engines["gpu-b"].post("/sleep?level=1", timeout=300)
        assert slept.status_code == 200, slept.text
        gateway_port = free_port()
        started = sm120(home, "gateway", "start", "--port", str(gateway_port), "--max-awake", "1")
        assert started.returncode == 0, started.stderr
        url, key = f"http://127.0.0.1:{gateway_port}", (home / "gateway" / "api_key").read_text()
        _chat(url, key.strip(), "gpu-a")  # awake already: no swap
        asleep = engines["gpu-b"].get("/is_sleeping", timeout=30).json()
        assert asleep == {"is_sleeping": True}
        wake_s = _chat(url, key.strip(), "gpu-b")  # gpu-a sleeps, gpu-b wakes
        awake = engines["gpu-a"].get("/is_sleeping", timeout=30).json()
        assert awake == {"is_sleeping": True}
        print(json.dumps({"cold_start_s": cold, "switch_s": wake_s}))
        assert wake_s <= 0.1 * cold["gpu-b"], (wake_s, cold)
    finally:
        sm120(home, "gateway", "stop")
        for name in ports:
            sm120(home, "stop", name)
