"""`sm120 test agent` against a hostile server: the wire it reads through (sm120.server.wire)
has the bounds `chat` has (bytes on the wire, headers within a bound, silences within a
bound) and one more, the whole exchange's time. Each kind of hostile answer ends its turn
with one line, within a bounded time; none ends in a traceback or runs on."""

from __future__ import annotations

import contextlib
import gzip
import json
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from sm120.measure.agent_protocol import call_problems
from sm120.measure.agent_session import tools_by_name
from sm120.server import transport
from sm120.server.wire import Exchange, Wire
from tests.fakes.loopback_server import LoopbackServer

Script = Callable[[BaseHTTPRequestHandler], None]


class _Hostile(BaseHTTPRequestHandler):
    script: Script = staticmethod(lambda _handler: None)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        # The client gives up at its bound: its side closes under the writes.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            type(self).script(self)

    def log_message(self, *_args: object) -> None:
        pass


def _headers(handler: BaseHTTPRequestHandler, **extra: str) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    for name, value in extra.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.end_headers()


def _event(data: dict[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def _tool_start() -> bytes:
    block = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}
    return _event({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}) + _event(
        {"type": "content_block_start", "index": 0, "content_block": block}
    )


def _exchange(script: Script, **bounds: float) -> tuple[Exchange, float]:
    handler = type("Handler", (_Hostile,), {"script": staticmethod(script)})
    with LoopbackServer(handler) as server:
        started = time.monotonic()
        with Wire(server.url, None, exchange_s=bounds.get("exchange_s", 60.0)) as wire:
            exchange = wire.messages([{"role": "user", "content": "hi"}], "m", max_tokens=8)
        return exchange, time.monotonic() - started


@pytest.fixture
def short_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same bounds, shorter, so each case takes a second rather than minutes.
    monkeypatch.setattr(transport, "STREAM_HEADERS_S", 0.5)
    monkeypatch.setattr(transport, "STREAM_STALL_S", 0.5)


def _forever(piece: bytes, pause_s: float = 0.0) -> Script:
    def script(handler: BaseHTTPRequestHandler) -> None:
        _headers(handler)
        while True:
            handler.wfile.write(piece)
            if pause_s:
                time.sleep(pause_s)

    return script


def test_an_endless_fast_stream_ends_at_the_byte_bound() -> None:
    exchange, took = _exchange(_forever(b": " + b"k" * 65_536 + b"\n"))
    assert exchange.error == "/v1/messages streamed more than 32 MiB"
    assert took < 30


def test_an_endless_slow_stream_ends_at_the_exchange_bound() -> None:
    exchange, took = _exchange(_forever(b": still here\n", pause_s=0.05), exchange_s=1.0)
    assert exchange.error == "/v1/messages was still streaming after 1 s"
    assert 1.0 <= took < 5


def test_headers_that_never_come(short_bounds: None) -> None:
    exchange, took = _exchange(lambda _handler: time.sleep(3))
    assert exchange.error is not None
    assert exchange.error.startswith("/v1/messages on http://127.0.0.1:")
    assert exchange.error.endswith(" did not answer in time")
    assert took < 2.5


@pytest.mark.parametrize("first", [b"", _tool_start()], ids=["after-headers", "mid-stream"])
def test_a_stall_ends_at_the_silence_bound(short_bounds: None, first: bytes) -> None:
    def script(handler: BaseHTTPRequestHandler) -> None:
        _headers(handler)
        handler.wfile.write(first)
        time.sleep(3)

    exchange, took = _exchange(script)
    assert exchange.error is not None
    assert exchange.error.startswith("/v1/messages on http://127.0.0.1:")
    assert exchange.error.endswith(" did not answer in time")
    assert took < 2.5


def test_thirty_mib_of_tool_input_is_refused_in_linear_time() -> None:
    delta = {"type": "content_block_delta", "index": 0}
    piece = _event({**delta, "delta": {"type": "input_json_delta", "partial_json": "a" * 4096}})

    def script(handler: BaseHTTPRequestHandler) -> None:
        _headers(handler)
        handler.wfile.write(_tool_start())
        for _ in range((30 << 20) // 4096):
            handler.wfile.write(piece)

    exchange, took = _exchange(script)
    assert exchange.error == "the stream sent more than 8 MiB of input for one tool call"
    # What came before the bound is kept, once: 8 MiB, not 30.
    assert len(exchange.tool_calls[0].arguments) <= 8 << 20
    assert took < 30


def test_a_deeply_nested_tool_input_is_a_problem_not_a_recursion_error() -> None:
    nested = "[" * 200_000 + "]" * 200_000
    delta = {"type": "input_json_delta", "partial_json": nested}

    def script(handler: BaseHTTPRequestHandler) -> None:
        _headers(handler)
        handler.wfile.write(_tool_start())
        handler.wfile.write(_event({"type": "content_block_delta", "index": 0, "delta": delta}))
        handler.wfile.write(_event({"type": "message_stop"}))

    exchange, _ = _exchange(script)
    assert exchange.error is None
    (call,) = exchange.tool_calls
    assert call_problems(call, tools_by_name()) == [
        "Read input is nested deeper than a JSON reader follows"
    ]


def test_a_gzip_labelled_answer_of_garbage_is_one_line() -> None:
    def script(handler: BaseHTTPRequestHandler) -> None:
        _headers(handler, Content_Encoding="gzip")
        handler.wfile.write(b"this is not gzip at all" * 100)

    exchange, _ = _exchange(script)
    assert exchange.error is not None
    assert exchange.error.startswith("/v1/messages on http://127.0.0.1:")
    assert exchange.error.endswith(
        " answered with a body its Content-Encoding does not describe (it does not decode)"
    )


def test_a_real_gzip_stream_still_reads() -> None:
    body = _tool_start() + _event({"type": "message_stop"})

    def script(handler: BaseHTTPRequestHandler) -> None:
        _headers(handler, Content_Encoding="gzip")
        handler.wfile.write(gzip.compress(body))

    exchange, _ = _exchange(script)
    assert exchange.error is None and [c.name for c in exchange.tool_calls] == ["Read"]


def test_the_agent_gate_fails_the_turn_and_goes_on_in_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sm120.measure import agent
    from sm120.measure.target import Target

    monkeypatch.setattr(agent, "AGENT_TURN_S", 1.0)
    handler = type(
        "Handler", (_Hostile,), {"script": staticmethod(_forever(b": x\n", pause_s=0.05))}
    )
    with LoopbackServer(handler) as server:
        target = Target(
            name="hostile", base_url=server.url, api_key=None, model="m", model_root=None,
            max_model_len=None, random_model=True, recipe="tiny",
        )  # fmt: skip
        started = time.monotonic()
        report = agent.run_agent(target, agent.AgentOptions(notes_tokens=0))
    took = time.monotonic() - started
    assert report["failed"] == 2 and took < 10
    for case in report["cases"]:
        assert case["failures"][0] == (
            f"turn 1: request failed: {agent._path(case['api'])} was still streaming after 1 s"
        )
