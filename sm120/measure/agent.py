"""`sm120 test agent`: replay a coding-agent session against a deployment, turn by turn.

Each turn is streamed as a client like Claude Code (/v1/messages) or Codex
(/v1/chat/completions) streams it, the model's tool call is answered with the scripted tool
result, and the conversation grows as an agent's does. Every answer is checked at the protocol
level (agent_protocol). On a real model each turn must also call the tool the instructions ask
for, with matching arguments; on a random model (`protocol_only`) the tool is forced through
tool_choice instead, which leaves only what the engine owns to check. The engine's
prefix-cache counters are read around every turn: the session's hit rate is the share of its
prompt tokens the cache served.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sm120.core.errors import SM120Error
from sm120.measure import metrics
from sm120.measure.agent_protocol import split_cut_off, turn_problems
from sm120.measure.agent_session import NOTES_HEADING, STEPS, SYSTEM_PROMPT, Step, tools_by_name
from sm120.measure.cases import Document
from sm120.measure.gates import DocumentMaker
from sm120.measure.target import Target
from sm120.server.wire import Exchange, ToolCall, Wire

SUITE = "agent"
APIS = ("messages", "chat")
DEFAULT_ANSWER_TOKENS = 1024
MAX_NOTES_TOKENS = 4000
# One turn streams a prompt of at most a few thousand tokens and DEFAULT_ANSWER_TOKENS back:
# a minute or two at the slowest decode a served model has. Past this the turn fails (a
# server that streams forever, however slowly, never trips a stall bound).
AGENT_TURN_S = 600.0
PROTOCOL_ONLY_RECIPES = ("tiny",)
"""Recipes whose weights are random: only the protocol can be checked."""
AGENT_VARIANTS = {"tiny": "agent"}
"""Recipes whose default context is too short for the session, and the variant sized for it."""

Prepare = Callable[[str, int, dict[str, Any]], dict[str, Any]]
"""(api, turn number, request fields) -> the fields to send: how a benchmark plays a client
that adds volatile text, or a gateway that normalises it."""
OnCase = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class AgentOptions:
    apis: tuple[str, ...] = APIS
    turns: int = len(STEPS)
    max_tokens: int | None = None
    """Per answer; None: DEFAULT_ANSWER_TOKENS."""
    protocol_only: bool | None = None
    """None: only on recipes with random weights (tiny)."""
    notes_tokens: int | None = None
    """Filler after the system prompt; None: a quarter of max-model-len, at most 4,000."""
    temperature: float | None = None


def agent_options(
    apis: Sequence[str],
    turns: int | None,
    max_tokens: int | None,
    protocol_only: bool | None,
    temperature: float | None,
) -> AgentOptions:
    """Checked before anything talks to the server."""
    names = [a.strip() for item in apis for a in item.split(",") if a.strip()]
    for name in names:
        if name not in APIS:
            raise SM120Error(f"unknown --api '{name}'", f"choose from: {', '.join(APIS)}")
    if turns is not None and not 1 <= turns <= len(STEPS):
        raise SM120Error(
            f"--turns {turns} is out of range", f"the session has 1 to {len(STEPS)} turns"
        )
    if max_tokens is not None and max_tokens < 1:
        raise SM120Error("--max-tokens must be at least 1", "e.g. --max-tokens 256")
    return AgentOptions(
        apis=tuple(dict.fromkeys(names)) or APIS,
        turns=turns or len(STEPS),
        max_tokens=max_tokens,
        protocol_only=protocol_only,
        temperature=temperature,
    )


def is_protocol_only(options: AgentOptions, target: Target) -> bool:
    if options.protocol_only is not None:
        return options.protocol_only
    return target.recipe in PROTOCOL_ONLY_RECIPES


SMALL_CONTEXT = 2048
"""Below this the base prompt (~600 tokens) and a few turns fill the context: no filler."""


def notes_tokens(options: AgentOptions, max_model_len: int | None) -> int:
    if options.notes_tokens is not None:
        return options.notes_tokens
    if max_model_len is None:
        return MAX_NOTES_TOKENS // 2
    if max_model_len < SMALL_CONTEXT:
        return 0
    return min(MAX_NOTES_TOKENS, max_model_len // 4)


def system_prompt(wire: Wire, model: str, tokens: int) -> str:
    if tokens <= 0:
        return SYSTEM_PROMPT
    notes = DocumentMaker(wire, model).make(Document(tokens=tokens, seed=36), tokens)
    return SYSTEM_PROMPT + NOTES_HEADING + notes + "\n"


def run_agent(
    target: Target,
    options: AgentOptions,
    on_case: OnCase = lambda _result: None,
    prepare: Prepare | None = None,
) -> dict[str, Any]:
    protocol_only = is_protocol_only(options, target)
    results = []
    with target.wire(exchange_s=AGENT_TURN_S) as wire:
        system = system_prompt(wire, target.model, notes_tokens(options, target.max_model_len))
        refuse_what_cannot_fit(wire, target, options, system)
        for api in options.apis:
            # A salt of its own at the head of the prompt: the hit rate is then this
            # session's own reuse, not blocks an earlier run or the other API's session left.
            own = f"Session {secrets.token_hex(4)}.\n{system}"
            session = Session(wire, target, options, protocol_only, own, api, prepare)
            result = session.run()
            on_case(result)
            results.append(result)
    failed = [r for r in results if not r["passed"]]
    return {
        "suite": SUITE,
        "deployment": target.name,
        "model": target.model,
        "endpoint": f"{target.base_url}/v1",
        "max_model_len": target.max_model_len,
        "mode": "protocol" if protocol_only else "full",
        "options": {"turns": options.turns, "max_tokens": options.max_tokens},
        "passed": len(results) - len(failed),
        "failed": len(failed),
        "prefix_cache": _cache_total([r["prefix_cache"] for r in results]),
        "cases": results,
    }


class AgentDoesNotFit(SM120Error):
    """The served context cannot hold the session's first turn."""


def refuse_what_cannot_fit(wire: Wire, target: Target, options: AgentOptions, system: str) -> None:
    """Before any turn: the first turn (the system prompt, the tools as the chat template
    renders them, the first message) and its answer must fit the served context, or every
    turn would fail alike. Said in one line, with the launch that fits; a server without
    /tokenize, or of no known context, is not asked."""
    limit = target.max_model_len
    if limit is None:
        return
    first = [{"role": "system", "content": system}, {"role": "user", "content": STEPS[0].say}]
    tools = [tool.for_chat() for tool in tools_by_name().values()]
    ids = wire.tokenize(target.model, messages=first, tools=tools)
    if ids is None:
        return
    answer = options.max_tokens or DEFAULT_ANSWER_TOKENS
    if len(ids) + answer <= limit:
        return
    raise AgentDoesNotFit(
        f"the agent session does not fit {target.model}'s {limit:,}-token context: its first "
        f"turn is {len(ids):,} prompt tokens (the {len(tools)} tools rendered by the chat "
        f"template) and {answer:,} to answer",
        _fit_hint(target, len(ids), limit),
    )


def _fit_hint(target: Target, prompt: int, limit: int) -> str:
    room = limit - prompt
    shorter = f", or answer in fewer tokens (--max-tokens {room})" if room >= 64 else ""
    variant = AGENT_VARIANTS.get(target.recipe or "")
    if variant:
        return f"launch the variant sized for agents: sm120 launch {target.recipe} -V {variant}"
    return f"relaunch with a longer context (--set max-model-len=N){shorter}"


class Session:
    """One replay of the session over one API."""

    def __init__(
        self,
        wire: Wire,
        target: Target,
        options: AgentOptions,
        protocol_only: bool,
        system: str,
        api: str,
        prepare: Prepare | None,
    ) -> None:
        self.wire, self.target, self.options = wire, target, options
        self.protocol_only, self.system, self.api = protocol_only, system, api
        self.prepare = prepare
        self.tools = tools_by_name()
        self.history: list[dict[str, Any]] = []
        self.pending: list[ToolCall] = []
        """The previous answer's tool calls, which this turn's message answers."""

    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        turns: list[dict[str, Any]] = []
        steps = STEPS[: self.options.turns]
        for number, step in enumerate(steps, start=1):
            record, exchange = self._turn(number, step, steps[number - 2] if number > 1 else None)
            turns.append(record)
            if record["failures"] and (exchange.error or (step.tool and not exchange.tool_calls)):
                break  # later turns answer a call that never came
            self._remember(exchange)
        failures = [f"turn {t['turn']}: {f}" for t in turns for f in t["failures"]]
        return {
            "suite": SUITE,
            "id": f"session-{self.api}",
            "title": f"coding-agent session over {_path(self.api)}",
            "api": self.api,
            "passed": not failures and len(turns) == len(steps),
            "failures": failures,
            "failure_ids": sorted({i for t in turns for i in t["failure_ids"]}),
            "warnings": [f"turn {t['turn']}: {w}" for t in turns for w in t["warnings"]],
            "seconds": time.perf_counter() - started,
            "prefix_cache": _cache_total([t["prefix_cache"] for t in turns]),
            "turns": turns,
        }

    def _turn(
        self, number: int, step: Step, previous: Step | None
    ) -> tuple[dict[str, Any], Exchange]:
        self._add_user(step, previous)
        fields = self._fields()
        if self.prepare is not None:
            fields = self.prepare(self.api, number, fields)
        forced = step.tool if self.protocol_only else None
        before = _counters(self.wire)
        exchange = self._ask(fields, step, forced)
        cache = _cache_delta(before, _counters(self.wire))
        failures = turn_problems(exchange, self.tools, forced)
        warnings: list[str] = []
        if self.protocol_only:
            failures, warnings = split_cut_off(exchange, failures)
        else:
            failures += expectation_problems(exchange, step)
        return (
            {
                "turn": number,
                "passed": not failures,
                "failures": failures,
                "failure_ids": self._failure_ids(exchange, step, failures),
                "warnings": warnings,
                "expected_tool": step.tool,
                "tool_choice": forced or ("any" if step.tool else "auto"),
                "prompt_tokens": exchange.prompt_tokens,
                "completion_tokens": exchange.completion_tokens,
                "ttft_s": exchange.ttft_s,
                "total_s": exchange.total_s,
                "finish_reason": exchange.finish_reason,
                "tool_calls": [
                    {"id": c.id, "name": c.name, "arguments": c.arguments}
                    for c in exchange.tool_calls
                ],
                "answer": exchange.content[:200],
                "prefix_cache": cache,
            },
            exchange,
        )

    def _failure_ids(self, exchange: Exchange, step: Step, failures: list[str]) -> list[str]:
        """Known tool-call breakers this turn's failure looks like (failures.yaml)."""
        if not failures or not step.tool or exchange.error:
            return []
        ids = []
        if self.api == "messages" and not exchange.tool_calls:
            ids.append("F06")
        speculative = self.target.speculative or {}
        if speculative.get("method") in ("mtp", "deepseek_mtp"):
            ids.append("F05b")
        return ids

    # --- the conversation ---------------------------------------------------------------

    def _add_user(self, step: Step, previous: Step | None) -> None:
        result = previous.result if previous else ""
        if self.api == "messages":
            blocks: list[dict[str, Any]] = [
                {"type": "tool_result", "tool_use_id": call.id, "content": result}
                for call in self.pending
            ]
            blocks.append({"type": "text", "text": step.say})
            self.history.append({"role": "user", "content": blocks})
            return
        for call in self.pending:
            self.history.append({"role": "tool", "tool_call_id": call.id, "content": result})
        self.history.append({"role": "user", "content": step.say})

    def _remember(self, exchange: Exchange) -> None:
        calls = [c for c in exchange.tool_calls if c.id and c.name in self.tools]
        self.pending = calls
        if self.api == "messages":
            blocks: list[dict[str, Any]] = []
            if exchange.content:
                blocks.append({"type": "text", "text": exchange.content})
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)} for c in calls
            ]
            self.history.append({"role": "assistant", "content": blocks or exchange.content})
            return
        message: dict[str, Any] = {"role": "assistant", "content": exchange.content or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(_input(c))},
                }
                for c in calls
            ]
        self.history.append(message)

    def _fields(self) -> dict[str, Any]:
        if self.api == "messages":
            tools = [tool.for_messages() for tool in self.tools.values()]
            if self.protocol_only:
                tools = [{**tool, "strict": True} for tool in tools]
            return {
                "system": [{"type": "text", "text": self.system}],
                "tools": tools,
                "messages": list(self.history),
            }
        chat_tools = [tool.for_chat() for tool in self.tools.values()]
        if self.protocol_only:
            chat_tools = [
                {**tool, "function": {**tool["function"], "strict": True}} for tool in chat_tools
            ]
        return {
            "messages": [{"role": "system", "content": self.system}, *self.history],
            "tools": chat_tools,
        }

    def _ask(self, fields: dict[str, Any], step: Step, forced: str | None) -> Exchange:
        max_tokens = self.options.max_tokens or DEFAULT_ANSWER_TOKENS
        if self.api == "messages":
            choice: dict[str, Any] | None = None
            if forced:
                choice = {"type": "tool", "name": forced, "disable_parallel_tool_use": True}
            elif step.tool:
                choice = {"type": "any"}
            return self.wire.messages(
                fields["messages"],
                self.target.model,
                max_tokens=max_tokens,
                system=fields.get("system"),
                tools=fields.get("tools"),
                temperature=self.options.temperature,
                tool_choice=choice,
            )
        chat_choice: str | dict[str, Any] | None = None
        if forced:
            chat_choice = {"type": "function", "function": {"name": forced}}
        elif step.tool:
            chat_choice = "required"
        return self.wire.chat(
            fields["messages"],
            self.target.model,
            tools=fields.get("tools"),
            max_tokens=max_tokens,
            temperature=self.options.temperature,
            tool_choice=chat_choice,
        )


def expectation_problems(exchange: Exchange, step: Step) -> list[str]:
    """What a capable model must do on this turn: the right tool with fitting arguments, or a
    text answer without a tool when none is asked for."""
    if exchange.error:
        return []
    if step.tool is None:
        problems = []
        if exchange.tool_calls:
            names = ", ".join(c.name for c in exchange.tool_calls)
            problems.append(f"called {names} where a text answer was asked for")
        if not exchange.content.strip():
            problems.append("no text answer")
        return problems
    calls = [c for c in exchange.tool_calls if c.name == step.tool]
    if not calls:
        names = ", ".join(c.name for c in exchange.tool_calls) or "no tool"
        return [f"expected a {step.tool} call, got {names}"]
    arguments = _input(calls[0])
    problems = []
    for name, pattern in step.arguments.items():
        value = arguments.get(name)
        if not isinstance(value, str) or not re.search(pattern, value, re.IGNORECASE):
            problems.append(f"{step.tool} {name}={value!r} does not match /{pattern}/")
    return problems


def _input(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments or "{}")
    except (json.JSONDecodeError, RecursionError):  # not JSON, or nested past the stack
        return {}
    return value if isinstance(value, dict) else {}


def _path(api: str) -> str:
    return "/v1/messages" if api == "messages" else "/v1/chat/completions"


def _counters(wire: Wire) -> dict[str, float] | None:
    text = wire.metrics_text()
    return None if text is None else metrics.parse_counters(text)


def _cache_delta(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, Any] | None:
    if before is None or after is None:
        return None
    figures = metrics.prefix_cache(metrics.difference(before, after))
    return None if figures is None else _with_rate(figures.queried_tokens, figures.hit_tokens)


def _cache_total(parts: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    known = [p for p in parts if p is not None]
    if not known:
        return None
    queried = sum(p["queried_tokens"] for p in known)
    return _with_rate(queried, sum(p["hit_tokens"] for p in known))


def _with_rate(queried: int, hits: int) -> dict[str, Any]:
    return {
        "queried_tokens": queried,
        "hit_tokens": hits,
        "hit_rate": hits / queried if queried else None,
    }
