"""Verdicts on one answer: the case's expectations, plus the checks every answer gets.

Every answer is checked for the failure modes the seeds report: an empty answer because
reasoning ate the budget (F12), reasoning leaking into the answer (F27), tool calls left as
text (F05) or missing on /v1/messages (F06), and garbage (wrong KV dtype, broken sparse
attention): replacement characters, control characters, unexpected CJK, repetition loops.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

from sm120.measure.cases import Check, ToolExpectation
from sm120.server.wire import Exchange, ToolCall

THINK_TAGS = re.compile(r"</?think>|<\|?(begin|end)_of_thought\|?>", re.IGNORECASE)
# Tool-call markup that a parser should have turned into tool_calls (hermes, GLM, DeepSeek).
TOOL_MARKUP = re.compile(
    r"<tool_call>|<\|tool_calls?_begin\|>|<arg_key>|<\|tool▁calls?▁begin\|>|\"arguments\"\s*:",
    re.IGNORECASE,
)
GARBLED_RATIO = 0.2
LOOP_WINDOW = 60
LOOP_UNIQUE_RATIO = 0.15


@dataclass
class Verdict:
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    failure_ids: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def fail(self, message: str, failure_id: str | None = None) -> None:
        self.failures.append(f"{message} ({failure_id})" if failure_id else message)
        if failure_id and failure_id not in self.failure_ids:
            self.failure_ids.append(failure_id)


def judge(
    exchange: Exchange,
    checks: Sequence[Check],
    *,
    thinking: bool | None,
    random_model: bool = False,
) -> Verdict:
    """`random_model`: the answer is noise by design (random weights), so garbled text and
    loops say nothing about the serving path and are not held against it."""
    verdict = Verdict()
    if exchange.error:
        verdict.fail(f"request failed: {exchange.error}")
        return verdict
    wants_tool = any(check.tool_call is not None for check in checks)
    _split(exchange, verdict, thinking=thinking, wants_tool=wants_tool)
    if not random_model:
        _garbage(exchange.content, verdict)
    for check in checks:
        _expectation(exchange, check, verdict)
    return verdict


def _split(
    exchange: Exchange, verdict: Verdict, *, thinking: bool | None, wants_tool: bool
) -> None:
    content = exchange.content.strip()
    if THINK_TAGS.search(exchange.content):
        verdict.fail("reasoning markup in the answer: the reasoning parser did not split it", "F27")
    if not content and not exchange.tool_calls:
        if exchange.finish_reason == "length":
            verdict.fail(
                "empty answer with finish_reason=length: reasoning used the whole budget",
                "F12",
            )
        elif exchange.reasoning.strip():
            verdict.fail(
                "empty answer: everything went to reasoning (it never closed its thinking)",
                "F27",
            )
        elif not wants_tool:
            verdict.fail(f"empty answer (finish_reason={exchange.finish_reason})")
    if thinking and not exchange.reasoning.strip() and not wants_tool:
        verdict.warnings.append("no reasoning came back separately, although the plan reasons")


def _garbage(content: str, verdict: Verdict) -> None:
    text = content.strip()
    if not text:
        return
    odd = sum(1 for ch in text if _is_odd(ch))
    if odd / len(text) > GARBLED_RATIO:
        verdict.fail(
            f"garbled answer: {odd} of {len(text)} characters are replacement, control or "
            "CJK characters"
        )
    words = text.split()
    if len(words) >= LOOP_WINDOW:
        tail = words[-LOOP_WINDOW:]
        if len(set(tail)) / LOOP_WINDOW < LOOP_UNIQUE_RATIO:
            verdict.fail(
                f"repetition loop: the last {LOOP_WINDOW} words use {len(set(tail))} distinct words"
            )


def _is_odd(ch: str) -> bool:
    if ch == "\ufffd":
        return True
    category = unicodedata.category(ch)
    if category.startswith("C") and ch not in "\n\r\t":
        return True
    # The gates ask in English; CJK in the answer is the classic broken-attention symptom.
    return "CJK" in unicodedata.name(ch, "") or "HANGUL" in unicodedata.name(ch, "")


def _expectation(exchange: Exchange, check: Check, verdict: Verdict) -> None:
    flags = re.IGNORECASE | re.MULTILINE
    if check.regex is not None and not re.search(check.regex, exchange.content, flags):
        where = ""
        if re.search(check.regex, exchange.reasoning, flags):
            where = ": it is only in the reasoning, not the answer"
        verdict.fail(f"expected {check.describe()}{where}; answer: {_preview(exchange.content)}")
    if check.not_regex is not None and re.search(check.not_regex, exchange.content, flags):
        verdict.fail(f"expected {check.describe()}; answer: {_preview(exchange.content)}")
    if check.tool_call is not None:
        _tool(exchange, check.tool_call, verdict)


def _tool(exchange: Exchange, wanted: ToolExpectation, verdict: Verdict) -> None:
    if not exchange.tool_calls:
        if TOOL_MARKUP.search(exchange.content) or wanted.name in exchange.content:
            verdict.fail(
                "the tool call came back as text in the answer, not parsed into "
                + ("tool_calls" if exchange.api == "chat" else "a tool_use block"),
                "F05",
            )
        elif exchange.api == "messages":
            verdict.fail("no tool_use block on /v1/messages", "F06")
        else:
            verdict.fail(f"no tool_calls (finish_reason={exchange.finish_reason})")
        return
    problems = [_call_problem(call, wanted) for call in exchange.tool_calls]
    if all(problems):
        verdict.fail(f"no matching {wanted.name} call: {problems[0]}")


def _call_problem(call: ToolCall, wanted: ToolExpectation) -> str | None:
    if call.name != wanted.name:
        return f"called '{call.name}'"
    try:
        arguments = json.loads(call.arguments or "{}")
    except (json.JSONDecodeError, RecursionError):
        return f"arguments are not JSON: {call.arguments[:80]!r}"
    if not isinstance(arguments, dict):
        return "arguments are not a JSON object"
    for key, pattern in wanted.arguments.items():
        value = arguments.get(key)
        if value is None:
            return f"argument '{key}' missing"
        if not re.search(pattern, str(value), re.IGNORECASE):
            return f"argument {key}={value!r} does not match /{pattern}/"
    return None


def _preview(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    return repr(flat[:limit] + ("..." if len(flat) > limit else ""))
