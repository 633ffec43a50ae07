"""The engine ward: what it passes, what it refuses, and a real ward process in front of a
stand-in engine listening on a unix socket (aiohttp, so its framing is a real server's)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from sm120.engine import ward
from sm120.server.framing import RequestHead
from sm120.server.request_reader import Request

KEY = "sk-ward-test-0123456789"


def head(method: str, path: str, *headers: tuple[str, str]) -> RequestHead:
    return RequestHead(method, path, (("host", "x"), *headers))


# --- the rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("GET", "/health", "probe"),
        ("GET", "/metrics", "probe"),
        ("HEAD", "/version", "probe"),
        ("POST", "/v1/chat/completions", "api"),
        ("POST", "/v1/messages", "api"),
        ("POST", "/v1/responses", "api"),
        ("POST", "/tokenize", "api"),
        ("GET", "/v1/models", "api"),
        ("GET", "/v1/models/tiny", "api"),
        ("GET", "/v1/responses/resp_1", "api"),
        ("POST", "/v1/responses/resp_1/cancel", "api"),
        ("DELETE", "/v1/responses/resp_1", "api"),
        # what vLLM registers beside the API and no key of its guards
        ("POST", "/invocations", "closed"),
        ("POST", "/collective_rpc", "closed"),
        ("POST", "/sleep", "closed"),
        ("POST", "/wake_up", "closed"),
        ("GET", "/is_sleeping", "closed"),
        ("POST", "/reset_prefix_cache", "closed"),
        ("POST", "/update_weights", "closed"),
        ("GET", "/docs", "closed"),
        ("GET", "/openapi.json", "closed"),
        ("POST", "/health", "closed"),
        ("GET", "/v1/chat/completions", "closed"),
        ("GET", "/v1/models/a/b", "closed"),
    ],
)
def test_route_kinds(method: str, path: str, kind: str) -> None:
    assert ward.route_kind(method, path) == kind


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ((("authorization", f"Bearer {KEY}"),), True),
        ((("authorization", f"bearer {KEY}"),), True),
        ((("x-api-key", KEY),), True),
        ((("authorization", f"Bearer {KEY}"), ("x-api-key", KEY)), True),
        ((), False),
        ((("authorization", "Bearer wrong"),), False),
        ((("authorization", f"Basic {KEY}"),), False),
        # one credential a request: a wrong one beside the right one is refused
        ((("authorization", "Bearer wrong"), ("x-api-key", KEY)), False),
        ((("authorization", f"Bearer {KEY}"), ("authorization", f"Bearer {KEY}")), False),
        ((("authorization", f"Bearer {KEY}"), ("authorization", "Bearer wrong")), False),
        ((("x-api-key", KEY), ("x-api-key", "wrong")), False),
    ],
)
def test_key_rule(headers: tuple[tuple[str, str], ...], ok: bool) -> None:
    assert ward.key_matches(head("POST", "/v1/completions", *headers), KEY) is ok


def test_errors_take_the_shape_of_the_protocol_asked() -> None:
    anthropic = ward.error_answer(401, "no", "/v1/messages")
    openai = ward.error_answer(401, "no", "/v1/chat/completions")
    assert json.loads(anthropic.split(b"\r\n\r\n", 1)[1])["type"] == "error"
    assert json.loads(openai.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 401
    assert b"www-authenticate: Bearer" in openai
    assert b"retry-after: 5" in ward.error_answer(503, "later", "/health")


def test_the_engine_gets_the_request_framed_anew() -> None:
    request = Request(
        RequestHead("POST", "/v1/completions?x=1", (("host", "h"), ("connection", "close"),
                    ("transfer-encoding", "chunked"), ("authorization", "Bearer k"))),
        b"{}", "1.1", True, False,
    )  # fmt: skip
    sent = ward.upstream_bytes(request)
    assert sent.startswith(b"POST /v1/completions?x=1 HTTP/1.1\r\n")
    assert b"connection:" not in sent and b"transfer-encoding" not in sent
    assert b"authorization: Bearer k\r\n" in sent
    assert sent.endswith(b"content-length: 2\r\n\r\n{}")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--host", "127.0.0.1", "--port", "8000"],
        ["--host", "127.0.0.1", "--port", "x", "--socket", "/s"],
        ["--host", "127.0.0.1", "--port", "70000", "--socket", "/s"],
        ["--host", "127.0.0.1", "--port", "1", "--socket", "/s", "--bogus", "1"],
    ],
)
def test_malformed_command_lines_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        ward.parse_args(argv)


# --- a real ward in front of a stand-in engine ----------------------------------------------


class StandInEngine:
    """An aiohttp server on a unix socket: what reaches it, and streamed answers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.cancelled = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _app(self) -> web.Application:
        app = web.Application()

        async def anything(request: web.Request) -> web.StreamResponse:
            self.seen.append((request.method, request.path_qs, dict(request.headers)))
            body = await request.read()
            if request.path == "/v1/chat/completions" and b'"stream": true' in body:
                response = web.StreamResponse()
                await response.prepare(request)
                try:
                    for index in range(int(request.query.get("n", "3"))):
                        await response.write(f"data: {index}\n\n".encode())
                        await asyncio.sleep(float(request.query.get("gap", "0")))
                except (ConnectionResetError, asyncio.CancelledError):
                    self.cancelled.set()
                    raise
                await response.write_eof()
                return response
            return web.json_response({"path": request.path, "body": body.decode()})

        app.router.add_route("*", "/{tail:.*}", anything)
        return app

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = web.AppRunner(self._app())
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.UnixSite(runner, str(self.path)).start())
        self._started.set()
        self.loop.run_forever()

    def start(self) -> None:
        self._thread.start()
        assert self._started.wait(10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    folder = Path(f"/tmp/sm120-ward-test-{os.getpid()}-{abs(hash(tmp_path)) % 10**6}")
    folder.mkdir(mode=0o700)
    yield folder / "api.sock"
    for item in folder.iterdir():
        item.unlink()
    folder.rmdir()


@pytest.fixture
def engine(socket_path: Path) -> Iterator[StandInEngine]:
    stand_in = StandInEngine(socket_path)
    stand_in.start()
    yield stand_in
    stand_in.stop()


def start_ward(socket_path: Path, key_file: Path | None) -> tuple[subprocess.Popen[str], int]:
    argv = ward.ward_argv(sys.executable, "127.0.0.1", 0, str(socket_path),
                          str(key_file) if key_file else None)  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith(ward.LISTENING), line
    return process, int(line.rsplit(":", 1)[1])


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api_key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def warded(engine: StandInEngine, socket_path: Path, key_file: Path) -> Iterator[str]:
    process, port = start_ward(socket_path, key_file)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    assert process.wait(10) == 0


AUTH = {"authorization": f"Bearer {KEY}"}


def test_api_routes_pass_with_the_key_and_only_with_it(warded: str, engine: StandInEngine) -> None:
    with httpx.Client(base_url=warded) as client:
        assert client.post("/v1/completions", json={"a": 1}).status_code == 401
        passed = client.post("/v1/completions", json={"a": 1}, headers=AUTH)
        assert passed.status_code == 200 and passed.json()["path"] == "/v1/completions"
        assert client.get("/health").status_code == 200  # probes need no key
        assert client.get("/v1/models", headers={"x-api-key": KEY}).status_code == 200
    assert [seen[:2] for seen in engine.seen] == [
        ("POST", "/v1/completions"), ("GET", "/health"), ("GET", "/v1/models"),
    ]  # fmt: skip


def test_routes_outside_the_api_never_reach_the_engine(warded: str, engine: StandInEngine) -> None:
    with httpx.Client(base_url=warded) as client:
        for path in ("/invocations", "/collective_rpc", "/sleep", "/update_weights"):
            answer = client.post(path, json={}, headers=AUTH)
            assert answer.status_code == 404
            assert "passes the API routes only" in answer.json()["error"]["message"]
    assert engine.seen == []


def test_a_streamed_answer_is_copied_as_it_comes_on_a_kept_alive_connection(
    warded: str, engine: StandInEngine
) -> None:
    with httpx.Client(base_url=warded) as client:
        for _ in range(3):
            with client.stream("POST", "/v1/chat/completions?n=4", headers=AUTH,
                               content=b'{"stream": true}') as answer:  # fmt: skip
                assert answer.status_code == 200
                assert list(answer.iter_lines()) == [
                    "data: 0", "", "data: 1", "", "data: 2", "", "data: 3", ""
                ]  # fmt: skip
    assert len(engine.seen) == 3


def test_pipelined_requests_are_answered_in_order(warded: str) -> None:
    port = int(warded.rsplit(":", 1)[1])
    one = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    two = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + KEY.encode()
           + b"\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(one + two)
        received = _read_all(client)
    assert received.count(b"HTTP/1.1 200") == 2
    assert received.index(b'"/health"') < received.index(b'"/v1/completions"')


def test_a_half_closed_client_still_gets_its_answer(warded: str) -> None:
    port = int(warded.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        client.shutdown(socket.SHUT_WR)
        received = _read_all(client)
    assert received.startswith(b"HTTP/1.1 200")


def test_a_malformed_request_is_refused_here(warded: str, engine: StandInEngine) -> None:
    port = int(warded.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"GET /health\nX-Injected:\t1 HTTP/1.1\r\nhost: x\r\n\r\n")
        received = _read_all(client)
    assert received.startswith(b"HTTP/1.1 400")
    assert engine.seen == []


def test_a_client_that_goes_away_mid_stream_cancels_the_engine_request(
    warded: str, engine: StandInEngine
) -> None:
    port = int(warded.rsplit(":", 1)[1])
    request = (b"POST /v1/chat/completions?n=1000&gap=0.01 HTTP/1.1\r\nhost: x\r\n"
               b"authorization: Bearer " + KEY.encode()
               + b'\r\ncontent-length: 16\r\n\r\n{"stream": true}')  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(request)
        assert client.recv(4096).startswith(b"HTTP/1.1 200")
    assert engine.cancelled.wait(10)


def test_no_engine_yet_is_a_503_not_a_hang(socket_path: Path, key_file: Path) -> None:
    process, port = start_ward(socket_path, key_file)
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
    finally:
        process.terminate()
        process.wait(10)


def test_a_new_key_in_the_key_file_takes_effect_without_a_restart(
    warded: str, key_file: Path
) -> None:
    key_file.write_text("sk-rotated-key-000000\n")
    deadline = 30
    with httpx.Client(base_url=warded) as client:
        for _ in range(deadline * 10):
            if client.get("/v1/models", headers={"x-api-key": "sk-rotated-key-000000"}).is_success:
                break
            threading.Event().wait(0.1)
        else:
            pytest.fail("the rotated key was never taken")
        assert client.get("/v1/models", headers=AUTH).status_code == 401


def test_a_taken_port_ends_the_ward_with_a_clear_error(socket_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        argv = ward.ward_argv(sys.executable, "127.0.0.1", port, str(socket_path), None)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert done.stdout == ""


def _read_all(client: socket.socket) -> bytes:
    chunks = []
    while chunk := client.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)
