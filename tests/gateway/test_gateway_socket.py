"""A warded deployment's engine listens only on a unix socket (DeploymentState.engine_socket),
and the gateway reaches it there itself: the front's fast path, the application's relay,
streamed and whole answers, a stored response asked for by id, the swap actions and the
readiness wait, against a real aiohttp server bound on a unix socket. The backend's URL
names a port nothing listens on: an answer can only have come over the socket."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sm120.engine.runtime.base import RuntimeStatus
from sm120.engine.secrets import ensure_api_key
from sm120.engine.state import DeploymentState, save_state
from sm120.gateway import proxy
from sm120.gateway.actions import EngineActions
from sm120.gateway.backends import discover
from sm120.gateway.front import Front, serving_front
from sm120.gateway.proxy import build_app
from sm120.gateway.restart import _wait_ready
from sm120.gateway.sessions import EngineSessions, client_session
from sm120.gateway.static import StaticBackendsError, load_static_backends
from sm120.gateway.swap import Swapper, SwapPolicy
from sm120.server.client import ServerClient
from tests.fakes.gateway import GATEWAY_KEY, FakeActions, backend
from tests.helpers import free_port

WORDS = ("one", "two", "three")


@dataclass
class SocketEngine:
    """An OpenAI-shaped engine on a unix socket: what each request carried (its Host, its
    key, which connection it came on), and the sleep state its dev routes keep."""

    path: str
    seen: list[dict[str, Any]] = field(default_factory=list)
    sleeping: bool = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/responses/{response_id}", self._stored)
        app.router.add_get("/health", self._health)
        app.router.add_post("/sleep", self._sleep)
        app.router.add_post("/wake_up", self._wake)
        app.router.add_get("/is_sleeping", self._is_sleeping)
        return app

    def _record(self, request: web.Request) -> None:
        self.seen.append(
            {
                "route": f"{request.method} {request.path_qs}",
                "host": request.host,
                "auth": request.headers.get("Authorization"),
                "connection": id(request.transport),
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        body = await request.json()
        if not body.get("stream"):
            message = {"role": "assistant", "content": " ".join(WORDS)}
            return web.json_response({"choices": [{"index": 0, "message": message}]})
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        for word in WORDS:
            event = {"choices": [{"index": 0, "delta": {"content": word}}]}
            await answer.write(f"data: {json.dumps(event)}\n\n".encode())
        await answer.write(b"data: [DONE]\n\n")
        await answer.write_eof()
        return answer

    async def _stored(self, request: web.Request) -> web.Response:
        self._record(request)
        if request.match_info["response_id"] != "resp_1":
            return web.json_response({"error": {"message": "no such response"}}, status=404)
        return web.json_response({"id": "resp_1", "object": "response"})

    async def _health(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.Response(text="")

    async def _sleep(self, request: web.Request) -> web.Response:
        self._record(request)
        self.sleeping = True
        return web.json_response({})

    async def _wake(self, request: web.Request) -> web.Response:
        self._record(request)
        self.sleeping = False
        return web.json_response({})

    async def _is_sleeping(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.json_response({"is_sleeping": self.sleeping})


@pytest.fixture
def socket_path() -> Iterator[str]:
    # pytest's tmp_path can be longer than a socket's path may be (107 bytes).
    folder = Path(tempfile.mkdtemp(prefix="sm120-sock-"))
    folder.chmod(0o700)
    try:
        yield str(folder / "api.sock")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def engine_on(path: str) -> AsyncIterator[SocketEngine]:
    engine = SocketEngine(path)
    runner = web.AppRunner(engine.app())
    await runner.setup()
    await web.UnixSite(runner, path).start()
    try:
        yield engine
    finally:
        await runner.cleanup()


@dataclass
class Stack:
    engine: SocketEngine
    front: Front
    client: aiohttp.ClientSession
    app: web.Application
    engine_url: str


@contextlib.asynccontextmanager
async def stack_on(path: str, **fields: Any) -> AsyncIterator[Stack]:
    """The engine on `path`, and the gateway as `sm120 gateway` runs it in front (the front,
    the application on an internal socket), its backend's URL a port nothing listens on."""
    url = f"http://127.0.0.1:{free_port()}"
    table = {"sim": backend("sim", url, api_key="engine-key", socket=path, **fields)}

    async def discover_table() -> dict[str, Any]:
        return dict(table)

    async with engine_on(path) as engine, aiohttp.ClientSession(auto_decompress=False) as tcp:
        swapper = Swapper(SwapPolicy(), FakeActions(table), discover_table)
        app = build_app(GATEWAY_KEY, swapper, tcp)
        internal = TestServer(app)
        await internal.start_server()
        assert internal.port is not None
        try:
            async with (
                serving_front(app, GATEWAY_KEY, (internal.host, internal.port), "127.0.0.1", 0)
                as front,
                aiohttp.ClientSession(
                    base_url=f"http://127.0.0.1:{front.port}",
                    headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
                ) as client,
            ):  # fmt: skip
                yield Stack(engine, front, client, app, url)
        finally:
            await internal.close()


CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}


async def _chunked(body: bytes) -> AsyncIterator[bytes]:
    yield body  # a chunked request body: the fast path hands it to the application


async def _chat(stack: Stack, stream: bool, chunked: bool) -> tuple[int, str, bytes]:
    body = json.dumps({**CHAT, "stream": stream}).encode()
    data: Any = _chunked(body) if chunked else body
    headers = {"Content-Type": "application/json"}
    async with stack.client.post("/v1/chat/completions", data=data, headers=headers) as answer:
        return answer.status, answer.headers.get("Content-Type", ""), await answer.read()


def _streamed_words(raw: bytes) -> list[str]:
    events = [line.removeprefix("data: ") for line in raw.decode().split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(
    ("chunked", "counts"), [(False, (2, 0)), (True, (0, 2))], ids=["fast path", "relay"]
)
def test_a_warded_engine_answers_over_its_socket_on_both_paths(
    socket_path: str, stream: bool, chunked: bool, counts: tuple[int, int]
) -> None:
    async def scenario() -> tuple[list[tuple[int, str, bytes]], Stack, list[str]]:
        async with stack_on(socket_path) as stack:
            answers = [await _chat(stack, stream, chunked) for _ in range(2)]
            return answers, stack, stack.app[proxy.SESSIONS].sockets

    answers, stack, sockets = asyncio.run(scenario())
    for status, kind, raw in answers:
        assert status == 200, raw
        if stream:
            assert kind.startswith("text/event-stream")
            assert _streamed_words(raw) == list(WORDS)
        else:
            assert json.loads(raw)["choices"][0]["message"]["content"] == "one two three"
    front = stack.front
    assert (front.counts.answered, front.counts.handed_over) == counts
    seen = stack.engine.seen
    authority = stack.engine_url.removeprefix("http://")
    # The Host header the deployment's URL gives, the deployment's own key (never the
    # gateway's), and one kept-alive socket connection for both requests.
    assert [(s["route"], s["host"], s["auth"]) for s in seen] == [
        ("POST /v1/chat/completions", authority, "Bearer engine-key")
    ] * 2
    assert seen[0]["connection"] == seen[1]["connection"]
    # The relay's session for the socket is made once and kept; the fast path needs none.
    assert sockets == ([socket_path] if chunked else [])


def test_the_application_closes_the_socket_sessions_it_made(socket_path: str) -> None:
    async def scenario() -> tuple[EngineSessions, list[aiohttp.ClientSession]]:
        async with stack_on(socket_path) as stack:
            await _chat(stack, True, chunked=True)
            sessions = stack.app[proxy.SESSIONS]
            made = list(sessions._by_socket.values())
        return sessions, made

    sessions, made = asyncio.run(scenario())
    assert len(made) == 1
    assert made[0].closed
    assert sessions.sockets == []


def test_a_stored_response_is_asked_for_over_the_socket(socket_path: str) -> None:
    async def scenario() -> tuple[tuple[int, Any], tuple[int, Any], Stack]:
        async with stack_on(socket_path) as stack:
            async with stack.client.get("/v1/responses/resp_1") as found:
                known = found.status, await found.json()
            async with stack.client.get("/v1/responses/resp_9") as missing:
                unknown = missing.status, await missing.json()
            return known, unknown, stack

    known, unknown, stack = asyncio.run(scenario())
    assert known == (200, {"id": "resp_1", "object": "response"})
    assert unknown[0] == 404
    assert unknown[1]["error"]["message"] == "no running deployment holds response resp_9"
    assert [s["route"] for s in stack.engine.seen] == [
        "GET /v1/responses/resp_1",
        "GET /v1/responses/resp_9",
    ]


def test_a_socket_that_nobody_listens_on_is_the_502_that_names_the_deployment(
    socket_path: str,
) -> None:
    async def scenario() -> tuple[int, dict[str, Any]]:
        async with stack_on(socket_path) as stack:
            Path(socket_path).unlink()  # the engine is gone: its socket with it
            status, _, raw = await _chat(stack, False, chunked=False)
            return status, json.loads(raw)

    status, body = asyncio.run(scenario())
    assert status == 502
    assert body["error"]["deployment"] == "dep-sim"
    assert body["error"]["message"].startswith("deployment dep-sim did not answer: ")


def test_swap_actions_go_to_the_socket_with_the_engines_key(socket_path: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    target = backend("m", url, api_key="k", sleep_mode=True, socket=socket_path)

    async def scenario() -> tuple[list[bool], SocketEngine, EngineSessions]:
        async with engine_on(socket_path) as engine, client_session(aiohttp.TCPConnector()) as tcp:
            sessions = EngineSessions(tcp)
            actions = EngineActions(sessions)
            answers = [await actions.is_sleeping(target)]
            await actions.sleep(target)
            answers.append(await actions.is_sleeping(target))
            await actions.wake(target)
            answers.append(await actions.is_sleeping(target))
            await sessions.close()
        return answers, engine, sessions

    answers, engine, sessions = asyncio.run(scenario())
    assert answers == [False, True, False]
    assert [(s["route"], s["auth"]) for s in engine.seen] == [
        ("GET /is_sleeping", "Bearer k"),
        ("POST /sleep?level=1", "Bearer k"),
        ("GET /is_sleeping", "Bearer k"),
        ("POST /wake_up", "Bearer k"),
        ("GET /is_sleeping", "Bearer k"),
    ]
    # One session for the socket, shared by the actions: one kept-alive connection.
    assert len({s["connection"] for s in engine.seen}) == 1
    assert sessions.sockets == []


def test_discovery_takes_the_socket_from_the_running_deployments_state() -> None:
    state = DeploymentState(
        name="warded", recipe="tiny", runtime="native", supervisor_pid=4_194_303,
        engine_pid=None, host="127.0.0.1", port=9011, plan_hash="h", started_at=time.time(),
        log_path="/nonexistent/serve.log", exit_file="/nonexistent/exit.json",
        served_model_name="m-warded", model_dir=None,
        api_key_file=str(ensure_api_key("warded", None)),
        engine_socket="/tmp/sm120-0/abc/api.sock",
    )  # fmt: skip
    save_state(state)
    save_state(dataclasses.replace(state, name="plain", served_model_name="m-plain",
                                   engine_socket=None, api_key_file=None))  # fmt: skip
    found = discover()
    warded, plain = found["m-warded"], found["m-plain"]
    assert (warded.base_url, warded.socket) == ("http://127.0.0.1:9011", state.engine_socket)
    assert plain.socket is None


def test_a_static_backend_may_name_its_socket(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("k\n")
    row = {"model": "a", "service": "svc", "url": "http://127.0.0.1:8000",
           "key_file": str(tmp_path / "key")}  # fmt: skip
    file = tmp_path / "backends.json"
    file.write_text(json.dumps({"backends": [{**row, "socket": "/run/a/api.sock"}]}))
    assert load_static_backends(file)["a"].socket == "/run/a/api.sock"
    file.write_text(json.dumps({"backends": [row]}))
    assert load_static_backends(file)["a"].socket is None
    file.write_text(json.dumps({"backends": [{**row, "socket": 7}]}))
    with pytest.raises(StaticBackendsError) as caught:
        load_static_backends(file)
    assert caught.value.one_line().startswith(
        f"backends file {file}: backend 'a' has a socket that is not a path (hint: "
    )


class _LiveRuntime:
    """A runtime whose engine runs and logs nothing (the wait goes by /health alone)."""

    def follow(self, state: DeploymentState) -> Iterator[str]:
        return iter(())

    def status(self, state: DeploymentState) -> RuntimeStatus:
        return RuntimeStatus(running=True, exit=None, pid=None, stale=False)

    def exit_info(self, state: DeploymentState) -> None:
        return None


def test_the_swaps_readiness_wait_asks_a_warded_engine_on_its_socket(socket_path: str) -> None:
    state = DeploymentState(
        name="warded", recipe="tiny", runtime="native", supervisor_pid=4_194_303,
        engine_pid=None, host="127.0.0.1", port=free_port(), plan_hash="h",
        started_at=time.time(), log_path="/nonexistent/serve.log",
        exit_file="/nonexistent/exit.json", served_model_name="m", model_dir=None,
        api_key_file=str(ensure_api_key("warded", "engine-key")), engine_socket=socket_path,
    )  # fmt: skip

    async def scenario() -> SocketEngine:
        async with engine_on(socket_path) as engine:
            runtime: Any = _LiveRuntime()
            await asyncio.to_thread(_wait_ready, runtime, state, 10.0)
        return engine

    engine = asyncio.run(scenario())
    assert [(s["route"], s["host"]) for s in engine.seen][:1] == [
        ("GET /health", f"127.0.0.1:{state.port}")
    ]


def test_the_server_client_reaches_a_socket(socket_path: str) -> None:
    async def scenario() -> tuple[int | None, int | None]:
        async with engine_on(socket_path):
            url = f"http://127.0.0.1:{free_port()}"
            with ServerClient(url, "k", socket=socket_path) as on_socket, ServerClient(url) as tcp:
                return await asyncio.to_thread(on_socket.health), await asyncio.to_thread(
                    tcp.health
                )

    assert asyncio.run(scenario()) == (200, None)
