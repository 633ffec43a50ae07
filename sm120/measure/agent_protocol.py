"""Protocol checks on one streamed agent turn: what any model, even a random one, must get right.

The engine, not the model, owns these: the order of an Anthropic stream's events, tool_use
blocks with an id, a known name and input that validates against the tool's schema (with a
tool forced, structured output makes even random weights produce valid input), the stop
reason that matches the content, and usage counts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sm120.measure.cases import ToolSpec
from sm120.server.wire import Exchange, ToolCall

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def schema_problems(value: Any, schema: Mapping[str, Any], where: str = "input") -> list[str]:
    """Where `value` breaks `schema`: the JSON-schema keywords tool definitions use (type,
    properties, required, additionalProperties, enum, items). Unknown keywords pass."""
    problems: list[str] = []
    wanted = schema.get("type")
    if isinstance(wanted, str) and wanted in _JSON_TYPES:
        # JSON has no separate bool: True is not an integer here.
        is_bool = isinstance(value, bool)
        if not isinstance(value, _JSON_TYPES[wanted]) or (is_bool and wanted != "boolean"):
            return [f"{where} is {type(value).__name__}, the schema wants {wanted}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}={value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        problems += _object_problems(value, schema, where)
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            problems += schema_problems(item, schema["items"], f"{where}[{index}]")
    return problems


def _object_problems(value: dict[str, Any], schema: Mapping[str, Any], where: str) -> list[str]:
    problems = []
    properties = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if name not in value:
            problems.append(f"{where} lacks the required '{name}'")
    for name, item in value.items():
        if name in properties:
            problems += schema_problems(item, properties[name], f"{where}.{name}")
        elif schema.get("additionalProperties") is False:
            problems.append(f"{where} has '{name}', which the schema does not allow")
    return problems


def call_problems(call: ToolCall, tools: Mapping[str, ToolSpec]) -> list[str]:
    """A tool call that a client could not run as it came: no id, unknown name, bad input."""
    problems = []
    if not call.id:
        problems.append(f"the {call.name or 'unnamed'} call has no id")
    tool = tools.get(call.name)
    if tool is None:
        return [*problems, f"called '{call.name}', which is not among the tools sent"]
    try:
        arguments = json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        return [*problems, f"{call.name} input is not JSON: {call.arguments[:80]!r}"]
    except RecursionError:
        return [*problems, f"{call.name} input is nested deeper than a JSON reader follows"]
    return problems + schema_problems(arguments, tool.parameters, f"{call.name} input")


def stream_order_problems(events: Sequence[tuple[str, int | None]]) -> list[str]:
    """Anthropic's order: message_start, then content blocks one at a time (start, deltas,
    stop; indexes 0, 1, ...), then message_delta and message_stop. Pings may come anywhere."""
    kinds = [(kind, index) for kind, index in events if kind != "ping"]
    if not kinds:
        return ["the stream sent no events"]
    problems = []
    if kinds[0][0] != "message_start":
        problems.append(f"the stream starts with {kinds[0][0]}, not message_start")
    if kinds[-1][0] != "message_stop":
        problems.append(f"the stream ends with {kinds[-1][0]}, not message_stop")
    if len(kinds) < 2 or kinds[-2][0] != "message_delta":
        problems.append("no message_delta right before message_stop")
    return problems + _block_problems(kinds)


def _block_problems(kinds: Sequence[tuple[str, int | None]]) -> list[str]:
    open_block: int | None = None
    next_index = 0
    for kind, index in kinds:
        if kind == "content_block_start":
            if open_block is not None:
                return [f"block {index} starts before block {open_block} stopped"]
            if index != next_index:
                return [f"block {index} starts where block {next_index} was due"]
            open_block, next_index = index, next_index + 1
        elif kind in ("content_block_delta", "content_block_stop"):
            if index != open_block:
                return [f"{kind} for block {index} while block {open_block} is open"]
            if kind == "content_block_stop":
                open_block = None
        elif kind in ("message_delta", "message_stop") and open_block is not None:
            return [f"{kind} while block {open_block} is still open"]
    return []


def turn_problems(
    exchange: Exchange, tools: Mapping[str, ToolSpec], forced: str | None
) -> list[str]:
    """Everything wrong with one answer at the protocol level (empty: it is well-formed)."""
    if exchange.error:
        return [f"request failed: {exchange.error}"]
    problems = stream_order_problems(exchange.events) if exchange.api == "messages" else []
    for call in exchange.tool_calls:
        problems += call_problems(call, tools)
    if forced is not None and not any(call.name == forced for call in exchange.tool_calls):
        problems.append(f"tool_choice forced {forced}, but no {forced} call came back")
    tool_used = bool(exchange.tool_calls) and exchange.api == "messages"
    if tool_used and exchange.finish_reason != "tool_calls":
        problems.append(f"a tool_use block came with stop_reason {exchange.finish_reason!r}")
    if exchange.finish_reason is None:
        problems.append("no stop reason / finish_reason in the stream")
    if not exchange.prompt_tokens:
        problems.append("no prompt (input) token count in the usage")
    if not exchange.completion_tokens:
        problems.append("no completion (output) token count in the usage")
    return problems


# What max_tokens does to a call: its input unfinished (vLLM may close a cut call's JSON itself,
# so a cut input can also come back valid JSON that lacks required fields) and the stop reason.
CUT_OFF = re.compile(r"^\w+ input\b|came with stop_reason 'length'")


def split_cut_off(exchange: Exchange, problems: list[str]) -> tuple[list[str], list[str]]:
    """(problems, warnings): a call that max_tokens cut off cannot be valid JSON, whatever the
    engine does. Random weights rarely close a free string or stop emitting the whitespace
    JSON allows, so on them such a call is a warning (its input is not checked), not a fault."""
    if exchange.finish_reason != "length":
        return problems, []
    cut = [p for p in problems if CUT_OFF.search(p)]
    kept = [p for p in problems if p not in cut]
    return kept, [f"{p} (cut off at max_tokens: not checked)" for p in cut]
