"""The agent gate's protocol checks and expectations, on hand-made exchanges."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from sm120.core.errors import SM120Error
from sm120.measure.agent import AgentOptions, agent_options, expectation_problems, notes_tokens
from sm120.measure.agent_protocol import (
    call_problems,
    schema_problems,
    split_cut_off,
    stream_order_problems,
    turn_problems,
)
from sm120.measure.agent_session import STEPS, TOOLS, tools_by_name
from sm120.server.wire import Exchange, ToolCall

READ = tools_by_name()["Read"]
EDIT_SCHEMA = tools_by_name()["Edit"].parameters

GOOD_STREAM = [
    ("message_start", None),
    ("ping", None),
    ("content_block_start", 0),
    ("content_block_delta", 0),
    ("content_block_stop", 0),
    ("content_block_start", 1),
    ("content_block_delta", 1),
    ("content_block_delta", 1),
    ("content_block_stop", 1),
    ("message_delta", None),
    ("message_stop", None),
]


def _exchange(api: str = "messages", **fields: Any) -> Exchange:
    values: dict[str, Any] = {
        "finish_reason": "tool_calls",
        "prompt_tokens": 900,
        "completion_tokens": 30,
        "events": list(GOOD_STREAM) if api == "messages" else [],
        "tool_calls": [ToolCall("Read", '{"file_path": "src/ranges.py"}', "toolu_1")],
        **fields,
    }
    return Exchange(api=api, started=0.0, **values)


@pytest.mark.parametrize(
    "value",
    [
        {"file_path": "a.py", "old_string": "x", "new_string": "y"},
        {"file_path": "a.py", "old_string": "x", "new_string": "y", "replace_all": True},
        {"file_path": "a.py"},
        {"file_path": 3, "old_string": "x", "new_string": "y"},
        {"file_path": "a.py", "old_string": "x", "new_string": "y", "extra": 1},
        {"file_path": "a.py", "old_string": "x", "new_string": "y", "replace_all": 1},
        [],
    ],
)
def test_schema_check_agrees_with_jsonschema(value: Any) -> None:
    expected_valid = jsonschema.Draft202012Validator(EDIT_SCHEMA).is_valid(value)
    assert (schema_problems(value, EDIT_SCHEMA) == []) is expected_valid


def test_schema_problems_say_what_is_wrong() -> None:
    assert schema_problems({"limit": True}, READ.parameters, "Read input") == [
        "Read input lacks the required 'file_path'",
        "Read input.limit is bool, the schema wants integer",
    ]
    assert schema_problems("b", {"enum": ["a"]}) == ["input='b' is not one of ['a']"]
    assert schema_problems([1, "x"], {"type": "array", "items": {"type": "integer"}}) == [
        "input[1] is str, the schema wants integer"
    ]


def test_a_call_needs_an_id_a_known_name_and_json_input() -> None:
    tools = tools_by_name()
    assert call_problems(ToolCall("Read", '{"file_path": "a"}', "t1"), tools) == []
    assert call_problems(ToolCall("Read", '{"file_path": "a"}', ""), tools) == [
        "the Read call has no id"
    ]
    assert call_problems(ToolCall("Write", "{}", "t1"), tools) == [
        "called 'Write', which is not among the tools sent"
    ]
    assert call_problems(ToolCall("Read", '{"file_path": ', "t1"), tools) == [
        "Read input is not JSON: '{\"file_path\": '"
    ]


def test_a_well_formed_stream_has_no_order_problems() -> None:
    assert stream_order_problems(GOOD_STREAM) == []


@pytest.mark.parametrize(
    ("events", "problem"),
    [
        ([], "the stream sent no events"),
        (GOOD_STREAM[2:], "the stream starts with content_block_start, not message_start"),
        (GOOD_STREAM[:-1], "the stream ends with message_delta, not message_stop"),
        (
            [*GOOD_STREAM[:5], ("message_stop", None)],
            "no message_delta right before message_stop",
        ),
        (
            [GOOD_STREAM[0], ("content_block_start", 1), *GOOD_STREAM[-2:]],
            "block 1 starts where block 0 was due",
        ),
        (
            [GOOD_STREAM[0], ("content_block_start", 0), ("content_block_start", 1)],
            "block 1 starts before block 0 stopped",
        ),
        (
            [GOOD_STREAM[0], ("content_block_delta", 0), *GOOD_STREAM[-2:]],
            "content_block_delta for block 0 while block None is open",
        ),
        (
            [GOOD_STREAM[0], ("content_block_start", 0), *GOOD_STREAM[-2:]],
            "message_delta while block 0 is still open",
        ),
    ],
)
def test_stream_order_problems(events: list[tuple[str, int | None]], problem: str) -> None:
    assert problem in stream_order_problems(events)


def test_a_good_turn_has_no_problems_on_either_api() -> None:
    tools = tools_by_name()
    assert turn_problems(_exchange(), tools, "Read") == []
    assert turn_problems(_exchange("chat", finish_reason="stop"), tools, "Read") == []


def test_turn_problems_name_each_protocol_fault() -> None:
    tools = tools_by_name()
    assert turn_problems(_exchange(error="HTTP 400: too long"), tools, "Read") == [
        "request failed: HTTP 400: too long"
    ]
    problems = turn_problems(
        _exchange(finish_reason="stop", prompt_tokens=None, completion_tokens=0, tool_calls=[]),
        tools,
        "Edit",
    )
    assert problems == [
        "tool_choice forced Edit, but no Edit call came back",
        "no prompt (input) token count in the usage",
        "no completion (output) token count in the usage",
    ]
    assert turn_problems(_exchange(finish_reason="stop"), tools, None) == [
        "a tool_use block came with stop_reason 'stop'"
    ]
    assert turn_problems(_exchange(finish_reason=None), tools, None)[-1] == (
        "no stop reason / finish_reason in the stream"
    )


def test_a_real_model_must_pick_the_asked_tool_with_fitting_arguments() -> None:
    read, edit, final = STEPS[0], STEPS[1], STEPS[-1]
    assert expectation_problems(_exchange(), read) == []
    assert expectation_problems(_exchange(), edit) == ["expected a Edit call, got Read"]
    wrong = _exchange(tool_calls=[ToolCall("Read", '{"file_path": "README.md"}', "t")])
    assert expectation_problems(wrong, read) == [
        "Read file_path='README.md' does not match /src/ranges\\.py/"
    ]
    assert expectation_problems(_exchange(content="Fixed it."), final) == [
        "called Read where a text answer was asked for"
    ]
    assert expectation_problems(_exchange(tool_calls=[], content=" "), final) == ["no text answer"]


def test_the_session_asks_only_for_tools_it_defines() -> None:
    names = {tool.name for tool in TOOLS}
    assert len(STEPS) == 10
    assert {step.tool for step in STEPS} - {None} <= names
    for step in STEPS:
        if step.tool:
            properties = tools_by_name()[step.tool].parameters["properties"]
            assert set(step.arguments) <= set(properties)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((["responses"], None, None), "unknown --api 'responses'"),
        (([], 0, None), "--turns 0 is out of range"),
        (([], 11, None), "--turns 11 is out of range"),
        (([], None, 0), "--max-tokens must be at least 1"),
    ],
)
def test_bad_agent_options_are_refused(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(SM120Error) as raised:
        agent_options(*args, protocol_only=None, temperature=None)
    assert raised.value.message == message


def test_agent_options_default_to_both_apis_and_every_turn() -> None:
    options = agent_options([], None, None, None, None)
    assert (options.apis, options.turns) == (("messages", "chat"), 10)
    assert agent_options(["chat,messages", "chat"], 3, 64, True, 0.0).apis == ("chat", "messages")


def test_a_call_cut_off_at_max_tokens_is_a_warning_only_for_that_reason() -> None:
    tools = tools_by_name()
    cut = _exchange(finish_reason="length", tool_calls=[ToolCall("Read", '{"file_pa', "t")])
    problems, warnings = split_cut_off(cut, turn_problems(cut, tools, "Read"))
    assert problems == []
    assert warnings == [
        "Read input is not JSON: '{\"file_pa' (cut off at max_tokens: not checked)",
        "a tool_use block came with stop_reason 'length' (cut off at max_tokens: not checked)",
    ]
    # a finished call is checked in full, and other faults stay faults when cut off
    done = _exchange(finish_reason="tool_calls", tool_calls=[ToolCall("Read", '{"file_pa', "t")])
    assert split_cut_off(done, turn_problems(done, tools, "Read"))[0] == [
        "Read input is not JSON: '{\"file_pa'"
    ]
    wrong = _exchange(finish_reason="length", tool_calls=[ToolCall("Grep", "{}", "")])
    problems, _ = split_cut_off(wrong, turn_problems(wrong, tools, "Read"))
    assert "the Grep call has no id" in problems
    assert "tool_choice forced Read, but no Read call came back" in problems


@pytest.mark.parametrize(
    ("given", "max_model_len", "tokens"),
    [(None, 1024, 0), (None, 4096, 1024), (None, 131072, 4000), (None, None, 2000), (7, 1024, 7)],
)
def test_the_filler_is_sized_to_the_context(
    given: int | None, max_model_len: int | None, tokens: int
) -> None:
    assert notes_tokens(AgentOptions(notes_tokens=given), max_model_len) == tokens


def test_a_cut_call_closed_by_the_engine_is_still_a_cut_call() -> None:
    cut = _exchange(finish_reason="length", tool_calls=[ToolCall("Edit", "{}", "t")])
    problems, warnings = split_cut_off(cut, turn_problems(cut, tools_by_name(), "Edit"))
    assert problems == []
    assert (
        warnings[0]
        == "Edit input lacks the required 'file_path' (cut off at max_tokens: not checked)"
    )
