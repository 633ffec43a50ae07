"""Run gate suites against a deployment: streamed, uncapped by default, timed per turn.

A case is a conversation. Each turn may carry a generated document (the haystack, with its
needles placed at given depths) before the user's question. Documents are sized in the
server's own tokens and shrunk to what the plan's max-model-len leaves after room for the
answers; the sizes actually sent are in the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sm120.measure.cases import Case, Document, RandomModel, Turn, for_random_model
from sm120.measure.judge import judge
from sm120.measure.target import Target
from sm120.measure.text import filler
from sm120.server.wire import Exchange, Wire

TEMPLATE_ROOM = 256
# How long one answer of a gate case may stream in all: a long thinking answer at the
# slowest decode a served model has. A server that trickles for ever (never stalling long
# enough to trip the stall bound, never reaching the 32 MiB cap) fails the case here.
GATE_TURN_S = 1800.0
TURN_ROOM = 64
"""Estimates of the conversation frame for servers that cannot count tokens (/tokenize)."""
DEFAULT_ANSWER_ROOM = 2048
"""Room kept per answer when answers are not capped (reasoning models think first)."""
FALLBACK_TOKENS_PER_SENTENCE = 20.0
SAFETY = 0.95


@dataclass(frozen=True)
class GateOptions:
    max_tokens: int | None = None
    """None: no cap, the model decides (seed 002's harness streams without max_tokens)."""
    temperature: float | None = None
    thinking: bool | None = None
    """None: whatever the deployment does by default."""


OnCase = Callable[[dict[str, Any]], None]


class DocumentMaker:
    """Filler sized in the server's tokens, needles placed at their depths."""

    def __init__(self, wire: Wire, model: str) -> None:
        self._wire = wire
        self._model = model
        self._per_sentence: float | None = None

    def tokens_per_sentence(self) -> float:
        if self._per_sentence is None:
            sample = filler(0, 80)
            ids = self._wire.tokenize(self._model, prompt=" ".join(sample))
            self._per_sentence = len(ids) / len(sample) if ids else FALLBACK_TOKENS_PER_SENTENCE
        return self._per_sentence

    def make(self, document: Document, tokens: int) -> str:
        """About `tokens` tokens, never more when the server can count them."""
        count = max(1, int(tokens * SAFETY / self.tokens_per_sentence()))
        text = self._text(document, count)
        for _ in range(3):  # the estimate is per sentence; needles and joins shift it a little
            ids = self._wire.tokenize(self._model, prompt=text)
            if ids is None or len(ids) <= tokens or count <= 1:
                break
            count = max(1, int(count * tokens / len(ids) * SAFETY))
            text = self._text(document, count)
        return text

    @staticmethod
    def _text(document: Document, count: int) -> str:
        sentences = filler(document.seed, count)
        # Insert from the deepest needle up, so earlier positions stay where they were meant.
        for needle in sorted(document.needles, key=lambda n: n.depth, reverse=True):
            sentences.insert(round(needle.depth * len(sentences)), needle.text)
        return " ".join(sentences)


def document_budget(
    case: Case, max_model_len: int | None, options: GateOptions, frame_tokens: int | None
) -> float:
    """The fraction of each document's target size that fits (1.0 when all of it does).

    `frame_tokens` is the conversation without documents and answers, as the server counts
    it; answers get their room on top (half again for the earlier ones, which come back
    re-tokenized in the history).
    """
    wanted = sum(turn.document.tokens for turn in case.turns if turn.document)
    if not wanted or max_model_len is None:
        return 1.0
    answer_room = options.max_tokens or min(DEFAULT_ANSWER_ROOM, max_model_len // 8)
    frame = (
        frame_tokens if frame_tokens is not None else TEMPLATE_ROOM + TURN_ROOM * len(case.turns)
    )
    room = max_model_len - frame - int(answer_room * len(case.turns) * 1.5) - 32
    if room <= 0:
        return 0.0
    return min(1.0, room / wanted)


def frame_tokens(wire: Wire, model: str, case: Case) -> int | None:
    """Tokens of every question with its document wrapper, as one conversation."""
    messages: list[dict[str, Any]] = []
    if case.system:
        messages.append({"role": "system", "content": case.system})
    for turn in case.turns:
        wrapper = "<document>\n\n</document>\n\n" if turn.document else ""
        messages.append({"role": "user", "content": wrapper + turn.user})
        messages.append({"role": "assistant", "content": "OK"})
    ids = wire.tokenize(model, messages=messages[:-1])
    return len(ids) if ids is not None else None


def run_cases(
    target: Target,
    suite: str,
    cases: Sequence[Case],
    options: GateOptions,
    on_case: OnCase = lambda _result: None,
    random_model: RandomModel | None = None,
) -> dict[str, Any]:
    """`random_model`: the target serves a random model, so each case checks what such a
    model can show (sm120/data/gates.yaml's random_model) instead of its expected answers."""
    if random_model is not None:
        cases = [for_random_model(case, random_model) for case in cases]
    results = []
    with target.wire(exchange_s=GATE_TURN_S) as wire:
        maker = DocumentMaker(wire, target.model)
        for case in cases:
            result = run_case(
                wire, maker, target, suite, case, options, random_model=random_model is not None
            )
            on_case(result)
            results.append(result)
    failed = [r for r in results if not r["passed"]]
    return {
        "suite": suite,
        "deployment": target.name,
        "model": target.model,
        "endpoint": f"{target.base_url}/v1",
        "max_model_len": target.max_model_len,
        "options": {
            "max_tokens": options.max_tokens,
            "temperature": options.temperature,
            "thinking": options.thinking,
        },
        "passed": len(results) - len(failed),
        "failed": len(failed),
        "random_model": random_model.why if random_model is not None else None,
        "cases": results,
    }


def run_case(
    wire: Wire,
    maker: DocumentMaker,
    target: Target,
    suite: str,
    case: Case,
    options: GateOptions,
    *,
    random_model: bool = False,
) -> dict[str, Any]:
    started = time.perf_counter()
    frame = frame_tokens(wire, target.model, case) if target.max_model_len else None
    scale = document_budget(case, target.max_model_len, options, frame)
    history: list[dict[str, Any]] = []
    if case.system and case.api == "chat":
        history.append({"role": "system", "content": case.system})
    turns: list[dict[str, Any]] = []
    thinking = options.thinking if options.thinking is not None else target.thinking
    sizes = _Sizes(case, target.max_model_len, options, frame, scale)
    for number, turn in enumerate(case.turns, start=1):
        tokens = sizes.for_turn(wire, target.model, history, number - 1)
        text, document_tokens = _user_text(maker, turn, tokens)
        history.append({"role": "user", "content": text})
        exchange = _ask(wire, target, case, history, options)
        verdict = judge(exchange, turn.expect, thinking=thinking, random_model=random_model)
        turns.append(_turn_record(number, exchange, verdict, document_tokens))
        if exchange.error:
            break  # later turns build on this answer
        history.append({"role": "assistant", "content": exchange.content})
    failures = [f"turn {t['turn']}: {f}" for t in turns for f in t["failures"]]
    return {
        "suite": suite,
        "id": case.id,
        "title": case.title,
        "api": case.api,
        "passed": not failures and len(turns) == len(case.turns),
        "failures": failures,
        "failure_ids": sorted({i for t in turns for i in t["failure_ids"]}),
        "warnings": [f"turn {t['turn']}: {w}" for t in turns for w in t["warnings"]],
        "seconds": time.perf_counter() - started,
        "turns": turns,
    }


@dataclass(frozen=True)
class _Sizes:
    """Document sizes per turn: the planned share, clamped to what is really left.

    Earlier answers come back in the history at whatever length the server re-tokenizes
    them to, so before each document the conversation so far is counted again and the
    document shrinks if later turns would otherwise not fit.
    """

    case: Case
    max_model_len: int | None
    options: GateOptions
    frame: int | None
    scale: float

    def planned(self, index: int) -> int:
        document = self.case.turns[index].document
        return int(document.tokens * self.scale) if document else 0

    def for_turn(
        self, wire: Wire, model: str, history: list[dict[str, Any]], index: int
    ) -> int | None:
        turn = self.case.turns[index]
        if turn.document is None:
            return None
        planned = self.planned(index)
        if self.max_model_len is None or self.frame is None:
            return planned
        question = {"role": "user", "content": "<document>\n\n</document>\n\n" + turn.user}
        ids = wire.tokenize(model, messages=[*history, question])
        if ids is None:
            return planned
        turns = len(self.case.turns)
        answer = self.options.max_tokens or min(DEFAULT_ANSWER_ROOM, self.max_model_len // 8)
        later = range(index + 1, turns)
        reserved = sum(self.frame // turns + int(answer * 1.5) + self.planned(i) for i in later)
        room = self.max_model_len - len(ids) - int(answer * 1.5) - reserved - 32
        return max(0, min(planned, room))


def _user_text(maker: DocumentMaker, turn: Turn, tokens: int | None) -> tuple[str, int | None]:
    if turn.document is None or tokens is None:
        return turn.user, None
    document = maker.make(turn.document, tokens)
    return f"<document>\n{document}\n</document>\n\n{turn.user}", tokens


def _ask(
    wire: Wire, target: Target, case: Case, history: list[dict[str, Any]], options: GateOptions
) -> Exchange:
    if case.api == "messages":
        return wire.messages(
            history,
            target.model,
            max_tokens=options.max_tokens or _room_left(wire, target, history),
            system=case.system,
            tools=[tool.for_messages() for tool in case.tools] or None,
            temperature=options.temperature,
            thinking=options.thinking,
        )
    return wire.chat(
        history,
        target.model,
        tools=[tool.for_chat() for tool in case.tools] or None,
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        thinking=options.thinking,
    )


def _room_left(wire: Wire, target: Target, history: list[dict[str, Any]]) -> int:
    """/v1/messages requires max_tokens: "no cap" means whatever the context leaves."""
    limit = target.max_model_len or 8192
    ids = wire.tokenize(target.model, messages=history)
    used = len(ids) if ids else limit // 2
    return max(16, limit - used - 64)


def _turn_record(
    number: int, exchange: Exchange, verdict: Any, document_tokens: int | None
) -> dict[str, Any]:
    return {
        "turn": number,
        "passed": verdict.passed,
        "failures": verdict.failures,
        "failure_ids": verdict.failure_ids,
        "warnings": verdict.warnings,
        "document_tokens": document_tokens,
        "prompt_tokens": exchange.prompt_tokens,
        "completion_tokens": exchange.completion_tokens,
        "ttft_s": exchange.ttft_s,
        "prefill_tps": exchange.prefill_tps,
        "decode_tps": exchange.decode_tps,
        "total_s": exchange.total_s,
        "finish_reason": exchange.finish_reason,
        "answer": exchange.content[:400],
        "reasoning_chars": len(exchange.reasoning),
        "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in exchange.tool_calls],
    }
