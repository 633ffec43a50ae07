"""The gateway in front of two real tiny vLLM CPU engines: listing, streaming fidelity,
unknown models, a killed backend, and the stop/start swap. One pair of engines serves the
whole module (each start costs ~45 s of the 2 CI cores)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port, port_is_free
from tests.integration.realstack import engine_processes, sm120, state_of

pytestmark = pytest.mark.integration

MODELS = ("tiny-a", "tiny-b")
CHAT = {"messages": [{"role": "user", "content": "Count with me: one"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("home")
    ports = {name: free_port() for name in MODELS}
    for name in MODELS:
        launched = sm120(
            home, "launch", "tiny", "--name", name, "--set", f"model.served_name={name}",
            "--port", str(ports[name]), "--model-dir", str(tiny_model), "--no-monitor",
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr[-3000:]
    gateway_port = free_port()
    started = sm120(home, "gateway", "start", "--port", str(gateway_port))
    assert started.returncode == 0, started.stderr
    info = {"home": home, "ports": ports, "gateway": f"http://127.0.0.1:{gateway_port}"}
    info["key"] = (home / "gateway" / "api_key").read_text().strip()
    yield info
    sm120(home, "gateway", "stop")
    for name in MODELS:
        sm120(home, "stop", name)
    for port in ports.values():
        assert engine_processes(port) == []


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _backend_key(stack: dict[str, Any], name: str) -> str:
    return (Path(stack["home"]) / "deployments" / name / "api_key").read_text().strip()


def _streamed(url: str, key: str, model: str, timeout: float = 120) -> tuple[list[str], str | None]:
    """The content pieces of a streamed greedy chat, and its finish reason."""
    body = {**CHAT, "model": model, "stream": True, "temperature": 0}
    pieces: list[str] = []
    finish = None
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=_auth(key), timeout=timeout
    ) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line.removeprefix("data: "))["choices"][0]
            pieces.append(choice["delta"].get("content") or "")
            finish = choice["finish_reason"] or finish
    return pieces, finish


def _models(stack: dict[str, Any]) -> dict[str, bool]:
    listed = httpx.get(f"{stack['gateway']}/v1/models", headers=_auth(stack["key"]), timeout=30)
    assert listed.status_code == 200
    return {entry["id"]: entry["awake"] for entry in listed.json()["data"]}


def test_models_lists_both_awake(stack: dict[str, Any]) -> None:
    assert _models(stack) == {"tiny-a": True, "tiny-b": True}


def test_a_streamed_chat_through_the_gateway_matches_a_direct_one(stack: dict[str, Any]) -> None:
    for name in MODELS:
        direct = _streamed(
            f"http://127.0.0.1:{stack['ports'][name]}", _backend_key(stack, name), name
        )
        relayed = _streamed(stack["gateway"], stack["key"], name)
        assert relayed == direct
        assert len([piece for piece in direct[0] if piece]) >= 4


def test_the_backend_key_does_not_open_the_gateway(stack: dict[str, Any]) -> None:
    answer = httpx.get(
        f"{stack['gateway']}/v1/models", headers=_auth(_backend_key(stack, "tiny-a")), timeout=30
    )
    assert answer.status_code == 401


def test_an_unknown_model_is_404_listing_the_models(stack: dict[str, Any]) -> None:
    answer = httpx.post(
        f"{stack['gateway']}/v1/completions",
        json={"model": "tiny-c", "prompt": "hi", "max_tokens": 2},
        headers=_auth(stack["key"]),
        timeout=30,
    )
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["message"] == "model 'tiny-c' is not served here; models: tiny-a, tiny-b"
    assert error["models"] == ["tiny-a", "tiny-b"]


def test_an_upstream_error_keeps_vllms_status(stack: dict[str, Any]) -> None:
    body = {**CHAT, "model": "tiny-a", "max_tokens": 100_000}
    relayed = httpx.post(
        f"{stack['gateway']}/v1/chat/completions",
        json=body,
        headers=_auth(stack["key"]),
        timeout=60,
    )
    direct = httpx.post(
        f"http://127.0.0.1:{stack['ports']['tiny-a']}/v1/chat/completions",
        json=body,
        headers=_auth(_backend_key(stack, "tiny-a")),
        timeout=60,
    )
    assert direct.status_code == 400
    assert (relayed.status_code, relayed.json()) == (direct.status_code, direct.json())


def test_a_killed_backend_answers_503_within_seconds(stack: dict[str, Any]) -> None:
    state = state_of(Path(stack["home"]), "tiny-b")
    assert state is not None and state["engine_pid"]
    os.kill(state["engine_pid"], signal.SIGKILL)
    started = time.monotonic()
    answer = httpx.post(
        f"{stack['gateway']}/v1/chat/completions",
        json={**CHAT, "model": "tiny-b"},
        headers=_auth(stack["key"]),
        timeout=30,
    )
    took = time.monotonic() - started
    assert answer.status_code in (502, 503), answer.text
    assert took < 10
    assert answer.json()["error"]["message"].startswith(
        ("model 'tiny-b' is not running", "deployment tiny-b did not answer")
    )
    # The engine's supervisor records the kill within a moment; then it is listed asleep.
    deadline = time.monotonic() + 10
    while _models(stack)["tiny-b"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _models(stack) == {"tiny-a": True, "tiny-b": False}


def test_the_gateway_swaps_by_stop_and_start(stack: dict[str, Any]) -> None:
    """With room for one, asking for the dead tiny-b stops tiny-a and starts tiny-b again
    from its saved launch spec (warm compile cache), and the request is answered."""
    home = Path(stack["home"])
    port = int(stack["gateway"].rsplit(":", 1)[1])
    assert sm120(home, "gateway", "stop").returncode == 0
    started = sm120(home, "gateway", "start", "--port", str(port), "--max-awake", "1")
    assert started.returncode == 0, started.stderr
    began = time.monotonic()
    # The request waits through the swap: a start takes about a minute on 2 busy cores.
    pieces, finish = _streamed(stack["gateway"], stack["key"], "tiny-b", timeout=500)
    swap_s = time.monotonic() - began
    print(f"\nswap (stop tiny-a, start tiny-b, answer): {swap_s:.1f} s")
    assert finish is not None and any(pieces)
    assert _models(stack) == {"tiny-a": False, "tiny-b": True}
    assert state_of(home, "tiny-a") is None
    assert port_is_free(stack["ports"]["tiny-a"])
    assert engine_processes(stack["ports"]["tiny-a"]) == []
    assert swap_s < 300
