"""Prompt normalisation for the engine's prefix cache: opt-in, meaning-preserving rewrites.

A prefix cache serves a prompt's tokens only up to the first one that differs from an earlier
prompt. Coding agents resend the whole conversation every turn, so a few volatile bytes near
the start of the prompt cost the whole conversation's prefill. This module rewrites a parsed
request body so that what does not change the request's meaning does not change its bytes
either. It is pure (no I/O, the input is never mutated) and every rewrite it makes is named
in the returned list; docs/gateway.md ("Prompt normalisation") argues why each is safe.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MESSAGES_PATH = "/v1/messages"
CHAT_PATH = "/v1/chat/completions"

BILLING_HEADER = "x-anthropic-billing-header:"
# Claude Code writes the header as one line, alone in its block or ahead of the real prompt.
_BILLING_LINE = re.compile(r"\A\s*x-anthropic-billing-header:[^\n]*(?:\n+|\Z)")

DROPPED_BILLING_BLOCK = "dropped the x-anthropic-billing-header system block"
STRIPPED_BILLING_LINE = "stripped the x-anthropic-billing-header line from the system prompt"
SORTED_TOOLS = "sorted the tools by name"


@dataclass(frozen=True)
class Normalized:
    body: dict[str, Any]
    changes: list[str] = field(default_factory=list)


def normalize(body: Mapping[str, Any], path: str) -> Normalized:
    """The body with its volatile prompt bytes made stable, and what was changed.

    Paths other than /v1/messages and /v1/chat/completions come back unchanged (a copy), as
    does any field whose shape is not the one the API defines: the engine, not this module,
    answers malformed requests.
    """
    out = copy.deepcopy(dict(body))
    changes: list[str] = []
    if path == MESSAGES_PATH:
        _messages_system(out, changes)
    elif path == CHAT_PATH:
        _chat_system(out, changes)
    else:
        return Normalized(out, changes)
    _sort_tools(out, changes, _messages_tool_name if path == MESSAGES_PATH else _chat_tool_name)
    return Normalized(out, changes)


def _messages_system(body: dict[str, Any], changes: list[str]) -> None:
    system = body.get("system")
    if isinstance(system, str):
        stripped = _BILLING_LINE.sub("", system, count=1)
        if stripped != system:
            body["system"] = stripped
            changes.append(STRIPPED_BILLING_LINE)
        return
    if not isinstance(system, list):
        return
    kept = _strip_billing_parts(system, changes)
    if kept is not None:
        body["system"] = kept


def _chat_system(body: dict[str, Any], changes: list[str]) -> None:
    """Clients that translate Claude Code to OpenAI put the header into the system message."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    kept: list[Any] = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            kept.append(message)
            continue
        content = message.get("content")
        if isinstance(content, str) and _is_billing(content):
            rest = _BILLING_LINE.sub("", content, count=1)
            if not rest.strip():
                changes.append(DROPPED_BILLING_BLOCK)  # a message that held only the header
                continue
            message = {**message, "content": rest}
            changes.append(STRIPPED_BILLING_LINE)
        elif isinstance(content, list):
            parts = _strip_billing_parts(content, changes)
            if parts is not None:
                message = {**message, "content": parts}
        kept.append(message)
    if changes:
        body["messages"] = kept


def _strip_billing_parts(parts: list[Any], changes: list[str]) -> list[Any] | None:
    """The text blocks without the header (None when none had it); a block that held only
    the header goes, one that shares it with real instructions keeps those."""
    kept: list[Any] = []
    touched = False
    for part in parts:
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str) and part.get("type") == "text" and _is_billing(text):
            touched = True
            rest = _BILLING_LINE.sub("", text, count=1)
            if rest.strip():
                kept.append({**part, "text": rest})
                changes.append(STRIPPED_BILLING_LINE)
            else:
                changes.append(DROPPED_BILLING_BLOCK)
            continue
        kept.append(part)
    return kept if touched else None


def _is_billing(text: str) -> bool:
    return text.lstrip().startswith(BILLING_HEADER)


def _messages_tool_name(tool: Any) -> str | None:
    name = tool.get("name") if isinstance(tool, dict) else None
    return name if isinstance(name, str) else None


def _chat_tool_name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def _sort_tools(body: dict[str, Any], changes: list[str], name_of: Any) -> None:
    """Tools by name, when every tool has a distinct name; a list already sorted is left as is.

    Duplicate or missing names leave the list alone: the engine should see (and reject) the
    request as the client wrote it.
    """
    tools = body.get("tools")
    if not isinstance(tools, list) or len(tools) < 2:
        return
    names = [name_of(tool) for tool in tools]
    if any(name is None for name in names) or len(set(names)) != len(names):
        return
    if names == sorted(names):
        return
    body["tools"] = [tool for _, tool in sorted(zip(names, tools, strict=True), key=_first)]
    changes.append(SORTED_TOOLS)


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]
