"""The gateway in front of a real tiny vLLM that listens only on a unix socket (`--uds`, as a
warded deployment's engine does), started by sm120's own native runtime and named in its
state file (DeploymentState.engine_socket): the official OpenAI SDK through the gateway gets
the same greedy answer streamed and whole, the fast path and the application's relay both
reach the engine over the socket, and the deployment's TCP port has nothing on it.

vLLM 0.32's --uds: "If set, host and port arguments are ignored" (it binds the path with
a plain bind, so a socket left by an earlier run must be gone first)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sm120.engine.log_capture import start_fresh_log
from sm120.engine.runtime.base import LaunchSpec
from sm120.engine.runtime.native import NativeRuntime
from sm120.engine.secrets import ensure_api_key, read_api_key
from sm120.engine.state import deployment_dir, engine_socket_path, save_state
from sm120.server.client import ServerClient
from tests.helpers import free_port, port_is_free
from tests.integration.realstack import engine_processes, sm120, state_of, wait_for

pytestmark = pytest.mark.integration

NAME = "tiny-uds"
ASK = [{"role": "user", "content": "Count with me: one"}]


def _spec(engine_python: Path, tiny_model: Path, socket: str, port: int, key: str) -> LaunchSpec:
    # tiny's own command (sm120 launch tiny --dry-run), with --uds: the --host and --port
    # given too are what vLLM ignores.
    argv = (
        str(engine_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model), "--served-model-name", NAME,
        "--host", "127.0.0.1", "--port", str(port), "--uds", socket,
        "--dtype", "bfloat16", "--max-model-len", "1024", "--max-num-seqs", "4",
    )  # fmt: skip
    return LaunchSpec(
        name=NAME, recipe="tiny", argv=argv,
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_API_KEY": key}, host="127.0.0.1",
        port=port, plan_hash="uds", served_model_name=NAME, model_dir=str(tiny_model),
        api_key_file=str(ensure_api_key(NAME, key)),
    )  # fmt: skip


@pytest.fixture(scope="module")
def warded(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, engine_python: Path
) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("home")
    port, gateway_port = free_port(), free_port()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SM120_HOME", str(home))
        socket = str(engine_socket_path(NAME))
        key_file = ensure_api_key(NAME, None)
        key = read_api_key(str(key_file))
        assert key is not None
        log_path = deployment_dir(NAME) / "logs" / "serve.log"
        start_fresh_log(log_path)
        state = NativeRuntime().start(_spec(engine_python, tiny_model, socket, port, key), log_path)
        # What a warded launch records: the engine is on the socket, the port is the ward's.
        save_state(dataclasses.replace(state, engine_socket=socket))
    try:
        with ServerClient(f"http://127.0.0.1:{port}", key, socket=socket) as engine:
            wait_for(
                "the engine on its socket",
                lambda: engine.health() == 200 or not _alive(home, port, log_path),
                timeout=600,
            )
        assert _alive(home, port, log_path)
        started = sm120(home, "gateway", "start", "--port", str(gateway_port))
        assert started.returncode == 0, started.stderr
        gateway_key = (home / "gateway" / "api_key").read_text().strip()
        yield {
            "home": home, "port": port, "socket": socket, "engine_key": key,
            "gateway": f"http://127.0.0.1:{gateway_port}", "key": gateway_key,
        }  # fmt: skip
    finally:
        sm120(home, "gateway", "stop")
        stopped = sm120(home, "stop", NAME)
        assert stopped.returncode == 0, stopped.stderr
        wait_for("the engine to be gone", lambda: engine_processes(port) == [], timeout=30)


def _alive(home: Path, port: int, log_path: Path) -> bool:
    if state_of(home, NAME) is None or not engine_processes(port):
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.is_file() else ""
        raise AssertionError(f"the engine exited before it served:\n{tail}")
    return True


def _openai(warded: dict[str, Any]) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{warded['gateway']}/v1", api_key=warded["key"], max_retries=0)


def _health(warded: dict[str, Any]) -> dict[str, int]:
    """The front's counts; /health is itself handed over, and counted before it answers."""
    counts: dict[str, int] = httpx.get(f"{warded['gateway']}/health", timeout=10).json()[
        "fast_path"
    ]
    return counts


def test_the_engine_listens_on_its_socket_alone(warded: dict[str, Any]) -> None:
    assert port_is_free(warded["port"])  # --port was ignored: nothing on TCP
    assert Path(warded["socket"]).is_socket()
    assert (Path(warded["socket"]).parent.stat().st_mode & 0o777) == 0o700
    assert state_of(warded["home"], NAME)["engine_socket"] == warded["socket"]  # type: ignore[index]


def test_the_openai_sdk_gets_the_same_answer_streamed_and_whole(warded: dict[str, Any]) -> None:
    sdk = _openai(warded)
    before = _health(warded)
    whole = sdk.chat.completions.create(
        model=NAME, messages=ASK, max_tokens=8, temperature=0, timeout=120
    )
    text = whole.choices[0].message.content
    assert isinstance(text, str) and text
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    pieces: list[str] = []
    finish = None
    for chunk in sdk.chat.completions.create(
        model=NAME, messages=ASK, max_tokens=8, temperature=0, stream=True, timeout=120
    ):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    # Greedy: the same text, in more than one event, and the same finish.
    assert ("".join(pieces), finish) == (text, whole.choices[0].finish_reason)
    assert len([piece for piece in pieces if piece]) >= 2
    # Both took the front's fast path, over the engine's socket.
    after = _health(warded)
    assert after["answered"] - before["answered"] == 2
    assert after["handed_over"] == before["handed_over"] + 1  # the /health asked after


def test_the_applications_relay_reaches_the_socket_too(warded: dict[str, Any]) -> None:
    body = json.dumps({"model": NAME, "messages": ASK, "max_tokens": 8, "temperature": 0})
    headers = {"Authorization": f"Bearer {warded['key']}", "Content-Type": "application/json"}
    before = _health(warded)
    # A chunked body: the front hands it to the application, which relays it (aiohttp's
    # UnixConnector session for the socket).
    relayed = httpx.post(
        f"{warded['gateway']}/v1/chat/completions",
        content=iter([body.encode()]), headers=headers, timeout=120,
    )  # fmt: skip
    assert relayed.status_code == 200, relayed.text
    assert "chunked" in relayed.request.headers.get("transfer-encoding", "")
    # The relayed request, and the /health that asks.
    assert _health(warded)["handed_over"] == before["handed_over"] + 2
    with ServerClient(
        f"http://127.0.0.1:{warded['port']}", warded["engine_key"], socket=warded["socket"]
    ) as engine:
        direct = engine.chat(ASK, NAME, max_tokens=8, temperature=0)
    assert relayed.json()["choices"][0]["message"]["content"] == direct.content


def test_the_gateway_lists_the_warded_model_awake(warded: dict[str, Any]) -> None:
    listed = httpx.get(
        f"{warded['gateway']}/v1/models",
        headers={"Authorization": f"Bearer {warded['key']}"},
        timeout=30,
    ).json()["data"]
    assert [(entry["id"], entry["awake"]) for entry in listed] == [(NAME, True)]
    assert os.environ.get("SM120_HOME") != str(warded["home"])  # the module left no setting
