"""`sm120 test agent` against a context the session cannot fit (tiny's default 1,024 tokens,
once its chat template renders the session's tools): refused before the first turn, in one
line, naming the launch that fits; a context that holds it runs as before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from sm120.measure.agent import AgentDoesNotFit, AgentOptions, refuse_what_cannot_fit
from sm120.measure.agent_session import SYSTEM_PROMPT, tools_by_name
from sm120.measure.target import Target
from sm120.server.wire import Wire
from tests.fakes.loopback_server import LoopbackServer
from tests.helpers import invoke, one_line_error


class _Counting(BaseHTTPRequestHandler):
    """/v1/models with a context; /tokenize counts one token per byte of the request, tools
    included (as tiny's byte-level tokenizer and a template that renders them would), and
    keeps what it got."""

    bodies: ClassVar[list[dict[str, Any]]] = []

    def _json(self, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._json({"data": [{"id": "m", "max_model_len": 1024}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if self.path != "/tokenize":
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        type(self).bodies.append(body)
        tokens = len(json.dumps(body["messages"]) + json.dumps(body.get("tools", [])))
        self._json({"tokens": list(range(tokens)), "count": tokens})

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def counting() -> Iterator[str]:
    _Counting.bodies = []
    with LoopbackServer(_Counting) as server:
        yield server.url


def _target(url: str, recipe: str | None, max_model_len: int | None) -> Target:
    return Target("demo", url, None, "m", None, max_model_len, recipe=recipe)


def test_tinys_default_context_is_refused_naming_the_agent_variant(
    counting: str,
) -> None:
    url = counting
    with Wire(url, None) as wire, pytest.raises(AgentDoesNotFit) as caught:
        refuse_what_cannot_fit(wire, _target(url, "tiny", 1024), AgentOptions(), SYSTEM_PROMPT)
    sent = _Counting.bodies[-1]
    assert [tool["function"]["name"] for tool in sent["tools"]] == list(tools_by_name())
    prompt = int(caught.value.message.split("first turn is ")[1].split(" ")[0].replace(",", ""))
    assert prompt > 1024
    assert caught.value.one_line() == (
        f"the agent session does not fit m's 1,024-token context: its first turn is "
        f"{prompt:,} prompt tokens (the 4 tools rendered by the chat template) and 1,024 to "
        "answer (hint: launch the variant sized for agents: sm120 launch tiny -V agent)"
    )


def test_a_context_the_answer_overflows_says_how_many_tokens_fit(
    counting: str,
) -> None:
    url = counting
    with Wire(url, None) as wire, pytest.raises(AgentDoesNotFit) as caught:
        refuse_what_cannot_fit(wire, _target(url, None, 4096), AgentOptions(), SYSTEM_PROMPT)
    prompt = int(caught.value.message.split("first turn is ")[1].split(" ")[0].replace(",", ""))
    assert prompt + 1024 > 4096 >= prompt + 64
    assert caught.value.hint == (
        f"relaunch with a longer context (--set max-model-len=N), or answer in fewer tokens "
        f"(--max-tokens {4096 - prompt})"
    )
    with Wire(url, None) as wire:  # the fewer tokens the hint names fit
        options = AgentOptions(max_tokens=4096 - prompt)
        refuse_what_cannot_fit(wire, _target(url, None, 4096), options, SYSTEM_PROMPT)


def test_a_context_that_holds_the_first_turn_is_not_refused(counting: str) -> None:
    url = counting
    with Wire(url, None) as wire:
        refuse_what_cannot_fit(wire, _target(url, "tiny", 65536), AgentOptions(), SYSTEM_PROMPT)
        refuse_what_cannot_fit(wire, _target(url, "tiny", None), AgentOptions(), SYSTEM_PROMPT)


def test_the_cli_refuses_before_the_first_turn(cli: CliRunner, counting: str) -> None:
    url = counting
    code, out, err = invoke(cli, "test", "agent", "--url", url)
    line = one_line_error(err)
    assert code == 2 and out == ""
    assert line.startswith("Error: the agent session does not fit m's 1,024-token context: ")
    assert line.endswith("(hint: relaunch with a longer context (--set max-model-len=N))")
    # Nothing but /tokenize was asked: no turn ran.
    assert len(_Counting.bodies) == 1
