"""One measurement of the objective on a running deployment, with sm120's own load generator
(measure/load.py: streamed /v1/completions, token-id prompts of exact lengths).

| objective | what is played | the figure |
|---|---|---|
| decode | the workload's requests one at a time | decode tok/s of one stream (higher wins) |
| aggregate | the workload's sessions N at a time | output tok/s over all streams (higher) |
| ttft | the workload's requests one at a time, 16 tokens each | median TTFT in ms (lower) |
| turn | the workload's sessions one at a time | median seconds per request, a turn (lower) |

Every round draws its own tokens (a `salt` in each part's seed), so round 2 does not find
round 1's prompts in the prefix cache; within a round, parts that share a hash share tokens.
"""

from __future__ import annotations

import hashlib
import random
import statistics
from dataclasses import dataclass
from typing import Literal

from sm120.measure.load import Conversation, LoadResult, run_sessions
from sm120.measure.text import vocabulary_sample
from sm120.server.wire import Wire
from sm120.tune.space import TuneError
from sm120.tune.workload import Session, Workload

ObjectiveName = Literal["decode", "aggregate", "ttft", "turn"]
OBJECTIVES: tuple[ObjectiveName, ...] = ("decode", "aggregate", "ttft", "turn")
TTFT_TOKENS = 16
DECODE_REQUESTS = 4
TTFT_REQUESTS = 12
TURN_SESSIONS = 1


class MeasureFailed(TuneError):
    """The deployment did not answer the workload."""


@dataclass(frozen=True)
class Objective:
    name: ObjectiveName
    concurrency: int

    @property
    def higher_is_better(self) -> bool:
        return self.name in ("decode", "aggregate")

    @property
    def unit(self) -> str:
        return {"decode": "tok/s", "aggregate": "tok/s", "ttft": "ms", "turn": "s"}[self.name]

    @property
    def label(self) -> str:
        """As a result names it: `aggregate at 16`, `decode`, `TTFT`, `turn time`."""
        if self.name == "aggregate":
            return f"aggregate at {self.concurrency}"
        return {"decode": "decode", "ttft": "TTFT", "turn": "turn time"}[self.name]

    def sessions_wanted(self) -> int:
        """How many sessions the workload is built with for this objective."""
        if self.name == "aggregate":
            return self.concurrency
        return {"decode": DECODE_REQUESTS, "ttft": TTFT_REQUESTS, "turn": TURN_SESSIONS}[self.name]


def check_objective(name: str) -> ObjectiveName:
    for known in OBJECTIVES:
        if name == known:
            return known
    raise TuneError(f"unknown --objective '{name}'", f"choose from: {', '.join(OBJECTIVES)}")


class PromptMaker:
    """Token ids for each part, drawn from ids the server's own tokenizer produced (always
    valid for the model) with the part's hash and the round's salt as the seed."""

    def __init__(self, wire: Wire, model: str) -> None:
        ids = wire.tokenize(model, prompt=vocabulary_sample())
        if not ids or len(set(ids)) < 8:
            raise MeasureFailed(
                "the server has no /tokenize: sm120 tune needs token ids to build its prompts",
                "serve with vLLM's OpenAI server (it has /tokenize)",
            )
        self._pool = sorted(set(ids))

    def ids(self, part_hash: str, tokens: int, salt: str) -> list[int]:
        seed = int(hashlib.sha256(f"{salt}:{part_hash}".encode()).hexdigest()[:16], 16)
        rng = random.Random(seed)
        return [rng.choice(self._pool) for _ in range(tokens)]

    def conversation(self, session: Session, salt: str, cap: int | None) -> Conversation:
        turns = []
        for turn in session:
            prompt = [i for p in turn.parts for i in self.ids(p.hash, p.tokens, salt)]
            turns.append((prompt, min(turn.output_tokens, cap or turn.output_tokens)))
        return turns


def measure(
    objective: Objective,
    workload: Workload,
    maker: PromptMaker,
    base_url: str,
    api_key: str | None,
    model: str,
    salt: str,
) -> float:
    """One figure of the objective; MeasureFailed when requests fail."""
    cap = TTFT_TOKENS if objective.name == "ttft" else None
    sessions = [maker.conversation(s, salt, cap) for s in workload.sessions]
    if objective.name in ("decode", "ttft"):
        # One request at a time, every turn its own: a session's order kept.
        sessions = [[turn] for session in sessions for turn in session]
        sessions = sessions[: objective.sessions_wanted()]
    concurrency = objective.concurrency if objective.name == "aggregate" else 1
    result = run_sessions(base_url, api_key, model, sessions, concurrency=concurrency)
    return figure(objective, result)


def figure(objective: Objective, result: LoadResult) -> float:
    if result.failed:
        raise MeasureFailed(
            f"{result.failed} of {len(result.requests)} requests failed: {result.first_error}",
            "see 'sm120 logs' of the candidate",
        )
    done = result.completed
    if objective.name == "aggregate":
        value = result.aggregate_tps
    elif objective.name == "decode":
        value = result.per_request_tps
    elif objective.name == "ttft":
        ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
        value = statistics.median(ttfts) * 1000 if ttfts else None
    else:
        spans = [r.ended - r.started for r in done if r.ended is not None]
        value = statistics.median(spans) if spans else None
    if value is None:
        raise MeasureFailed("the requests returned no figure", "see 'sm120 logs'")
    return float(value)
