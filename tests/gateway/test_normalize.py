"""The prompt normaliser: what it rewrites, what it must leave alone, and that it is pure."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from sm120.gateway.normalize import (
    CHAT_PATH,
    DROPPED_BILLING_BLOCK,
    MESSAGES_PATH,
    SORTED_TOOLS,
    STRIPPED_BILLING_LINE,
    normalize,
)

# As Claude Code 2.1.x sends it (cc_version and cch change per request).
HEADER = "x-anthropic-billing-header: cc_version=2.1.119.47e; cc_entrypoint=cli; cch=a7754;"
PROMPT = "You are Claude Code, Anthropic's official CLI for Claude."


def _tool(name: str) -> dict[str, Any]:
    return {"name": name, "description": f"{name} tool", "input_schema": {"type": "object"}}


def _chat_tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def _messages_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "glm",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": HEADER},
            {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }


def test_the_billing_block_is_dropped_and_the_rest_kept_byte_for_byte() -> None:
    result = normalize(_messages_body(), MESSAGES_PATH)
    assert result.body["system"] == [
        {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}
    ]
    assert result.changes == [DROPPED_BILLING_BLOCK]
    assert result.body["messages"] == [{"role": "user", "content": "hi"}]


def test_two_requests_that_differ_only_in_cch_normalise_to_the_same_bytes() -> None:
    first = _messages_body()
    second = _messages_body()
    second["system"][0]["text"] = HEADER.replace("a7754", "0aaa9").replace("47e", "51c")
    assert json.dumps(normalize(first, MESSAGES_PATH).body) == json.dumps(
        normalize(second, MESSAGES_PATH).body
    )


def test_a_header_sharing_its_block_keeps_the_instructions_after_it() -> None:
    body = _messages_body(system=[{"type": "text", "text": f"{HEADER}\n{PROMPT}"}])
    result = normalize(body, MESSAGES_PATH)
    assert result.body["system"] == [{"type": "text", "text": PROMPT}]
    assert result.changes == [STRIPPED_BILLING_LINE]


def test_a_string_system_prompt_loses_only_its_header_line() -> None:
    result = normalize(_messages_body(system=f"{HEADER}\n\n{PROMPT}"), MESSAGES_PATH)
    assert result.body["system"] == PROMPT
    assert result.changes == [STRIPPED_BILLING_LINE]


@pytest.mark.parametrize(
    "system",
    [
        PROMPT,
        [{"type": "text", "text": PROMPT}],
        # the words anywhere but at the start are the user's own text: left alone
        f"{PROMPT}\nx-anthropic-billing-header: cc_version=1; cch=1;",
        [{"type": "text", "text": f"Quote: {HEADER}"}],
        # not a text block: not the header Claude Code writes
        [{"type": "image", "text": HEADER}],
    ],
)
def test_prompts_without_a_leading_header_are_untouched(system: Any) -> None:
    body = _messages_body(system=system)
    result = normalize(body, MESSAGES_PATH)
    assert result.body == body and result.changes == []


def test_the_header_in_a_user_message_is_never_touched() -> None:
    body = _messages_body(messages=[{"role": "user", "content": HEADER}], system=PROMPT)
    assert normalize(body, MESSAGES_PATH).body["messages"][0]["content"] == HEADER


def test_chat_system_message_loses_the_header_a_translating_client_put_there() -> None:
    body = {
        "model": "glm",
        "messages": [
            {"role": "system", "content": f"{HEADER}\n\n{PROMPT}"},
            {"role": "user", "content": HEADER},
        ],
    }
    result = normalize(body, CHAT_PATH)
    assert result.body["messages"] == [
        {"role": "system", "content": PROMPT},
        {"role": "user", "content": HEADER},
    ]
    assert result.changes == [STRIPPED_BILLING_LINE]


def test_a_chat_system_message_holding_only_the_header_goes() -> None:
    body = {
        "messages": [
            {"role": "system", "content": HEADER},
            {"role": "system", "content": [{"type": "text", "text": PROMPT}]},
            {"role": "user", "content": "hi"},
        ]
    }
    result = normalize(body, CHAT_PATH)
    assert result.body["messages"] == body["messages"][1:]
    assert result.changes == [DROPPED_BILLING_BLOCK]


def test_chat_content_parts_are_handled_like_system_blocks() -> None:
    body = {
        "messages": [
            {
                "role": "developer",
                "content": [{"type": "text", "text": HEADER}, {"type": "text", "text": PROMPT}],
            }
        ]
    }
    result = normalize(body, CHAT_PATH)
    assert result.body["messages"][0]["content"] == [{"type": "text", "text": PROMPT}]


def test_tools_are_sorted_by_name_on_both_apis() -> None:
    messages = normalize(_messages_body(tools=[_tool("Read"), _tool("Bash")]), MESSAGES_PATH)
    assert [t["name"] for t in messages.body["tools"]] == ["Bash", "Read"]
    assert messages.changes == [DROPPED_BILLING_BLOCK, SORTED_TOOLS]
    chat = normalize({"messages": [], "tools": [_chat_tool("b"), _chat_tool("a")]}, CHAT_PATH)
    assert [t["function"]["name"] for t in chat.body["tools"]] == ["a", "b"]
    assert chat.changes == [SORTED_TOOLS]


def test_two_orders_of_the_same_tools_normalise_to_the_same_bytes() -> None:
    tools = [_tool("Read"), _tool("Edit"), _tool("Bash"), _tool("mcp__git__log")]
    one = normalize(_messages_body(tools=tools), MESSAGES_PATH).body
    other = normalize(_messages_body(tools=list(reversed(tools))), MESSAGES_PATH).body
    assert json.dumps(one) == json.dumps(other)


@pytest.mark.parametrize(
    "tools",
    [
        [_tool("Bash"), _tool("Read")],  # already sorted
        [_tool("Read"), _tool("Read")],  # duplicate names: the engine decides
        [_tool("Read"), {"description": "no name"}],
        [_tool("Read")],
    ],
)
def test_tool_lists_that_must_not_be_reordered(tools: list[Any]) -> None:
    body = {"messages": [], "tools": tools}
    result = normalize(body, MESSAGES_PATH)
    assert result.body["tools"] == tools and SORTED_TOOLS not in result.changes


def test_the_input_is_never_mutated() -> None:
    body = _messages_body(tools=[_tool("Read"), _tool("Bash")])
    before = copy.deepcopy(body)
    normalize(body, MESSAGES_PATH)
    assert body == before


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings", "/tokenize"])
def test_other_paths_pass_unchanged(path: str) -> None:
    body = _messages_body(tools=[_tool("Read"), _tool("Bash")])
    result = normalize(body, path)
    assert result.body == body and result.changes == []


@pytest.mark.parametrize(
    "body",
    [{"system": 3, "tools": "x"}, {"system": [3, None]}, {"messages": "nope"}, {}],
)
def test_malformed_shapes_are_left_for_the_engine_to_answer(body: dict[str, Any]) -> None:
    for path in (MESSAGES_PATH, CHAT_PATH):
        result = normalize(body, path)
        assert result.body == body and result.changes == []
