"""What a candidate is measured on: sessions of requests, each request a prompt made of parts
(a length and a hash) and a number of tokens to generate.

Parts with the same hash are the same tokens, so prompts that start with the same parts share
a prefix exactly as the real ones did: what the prefix cache sees is kept, the text never is.
The built-in shapes are `chat` (a mix of lengths under one short system prompt), `agent` (the
session `sm120 test agent` plays: a long system prompt and ten turns, each adding the answer
and a tool result), `long` (a long document revisited by several questions) and
`replay:FILE` (what a gateway recorded; the format is in docs/tune.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.bounded import read_text_capped
from sm120.tune.space import TuneError

WORKLOADS = ("chat", "agent", "long", "replay:FILE")
REPLAY_PREFIX = "replay:"
# The agent shape of `sm120 test agent` (measure/agent.py): ~600 tokens of instructions and
# tools, project notes of a quarter of the context (at most 4,000), ten turns.
AGENT_BASE_TOKENS = 600
AGENT_NOTES_TOKENS = 4000
AGENT_TURNS = 10
AGENT_TOOL_RESULT_TOKENS = 200
AGENT_USER_TOKENS = 40
AGENT_ANSWER_TOKENS = 128
CHAT_LENGTHS = (128, 512, 256, 1024, 2048, 384)
CHAT_SYSTEM_TOKENS = 64
CHAT_ANSWER_TOKENS = 128
LONG_QUESTIONS = 4
LONG_ANSWER_TOKENS = 64
REPLAY_MAX_BYTES = 64 << 20
# Room left under max-model-len for what the engine adds (a BOS) and rounding.
MARGIN_TOKENS = 8


@dataclass(frozen=True)
class Part:
    hash: str
    tokens: int


@dataclass(frozen=True)
class Turn:
    parts: tuple[Part, ...]
    output_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return sum(part.tokens for part in self.parts)


Session = tuple[Turn, ...]


@dataclass(frozen=True)
class Workload:
    name: str
    sessions: tuple[Session, ...]
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        turns = sum(len(s) for s in self.sessions)
        prompt = sum(t.prompt_tokens for s in self.sessions for t in s)
        return (
            f"{self.name}: {len(self.sessions)} sessions, {turns} requests, "
            f"{prompt // max(1, turns):,} prompt tokens each on average"
        )


def check_workload_name(name: str) -> None:
    if name in ("chat", "agent", "long"):
        return
    if name.startswith(REPLAY_PREFIX) and len(name) > len(REPLAY_PREFIX):
        return
    raise TuneError(f"unknown --workload '{name}'", f"choose from: {', '.join(WORKLOADS)}")


def build_workload(name: str, sessions: int, max_model_len: int | None) -> Workload:
    """`sessions` sessions of the named shape (a replay keeps its own), fitted under
    max-model-len: a prompt that would not fit is cut from its last parts, and said so."""
    check_workload_name(name)
    limit = (max_model_len or 1 << 20) - MARGIN_TOKENS
    if name.startswith(REPLAY_PREFIX):
        workload = read_replay(Path(name[len(REPLAY_PREFIX) :]).expanduser())
    elif name == "chat":
        workload = Workload("chat", tuple(_chat(i) for i in range(sessions)))
    elif name == "agent":
        workload = Workload("agent", tuple(_agent(i, limit) for i in range(sessions)))
    else:
        workload = Workload("long", tuple(_long(i, limit) for i in range(sessions)))
    return fitted(workload, limit)


def _chat(index: int) -> Session:
    length = CHAT_LENGTHS[index % len(CHAT_LENGTHS)]
    parts = (Part("chat-system", CHAT_SYSTEM_TOKENS), Part(f"chat-user-{index}", length))
    return (Turn(parts, CHAT_ANSWER_TOKENS),)


def _agent(index: int, limit: int) -> Session:
    notes = min(AGENT_NOTES_TOKENS, limit // 4)
    history = [Part("agent-system", AGENT_BASE_TOKENS), Part("agent-notes", notes)]
    turns = []
    for turn in range(AGENT_TURNS):
        history.append(Part(f"agent-{index}-user-{turn}", AGENT_USER_TOKENS))
        turns.append(Turn(tuple(history), AGENT_ANSWER_TOKENS))
        # What the next request carries: this answer and the tool's result.
        history.append(Part(f"agent-{index}-answer-{turn}", AGENT_ANSWER_TOKENS))
        history.append(Part(f"agent-{index}-tool-{turn}", AGENT_TOOL_RESULT_TOKENS))
    return tuple(turns)


def _long(index: int, limit: int) -> Session:
    document = Part(f"long-document-{index}", max(256, min(16384, int(limit * 0.6))))
    return tuple(
        Turn((document, Part(f"long-{index}-question-{q}", 32)), LONG_ANSWER_TOKENS)
        for q in range(LONG_QUESTIONS)
    )


def fitted(workload: Workload, limit: int) -> Workload:
    cut = 0
    sessions = []
    for session in workload.sessions:
        turns = []
        for turn in session:
            parts, room = [], limit - turn.output_tokens
            for part in turn.parts:
                if part.tokens > room:
                    if room > 0:
                        parts.append(Part(part.hash, room))
                    cut += 1
                    break
                parts.append(part)
                room -= part.tokens
            if parts:
                turns.append(Turn(tuple(parts), turn.output_tokens))
        if turns:
            sessions.append(tuple(turns))
    if not sessions:
        raise TuneError(
            f"workload {workload.name} has no request that fits max-model-len "
            f"{limit + MARGIN_TOKENS}",
            "raise max-model-len, or replay a log with shorter prompts",
        )
    notes = workload.notes + (
        (f"{cut} prompts cut to fit max-model-len {limit + MARGIN_TOKENS}",) if cut else ()
    )
    return Workload(workload.name, tuple(sessions), notes)


# --- replay ---------------------------------------------------------------------------


def read_replay(path: Path) -> Workload:
    """A JSON-lines record of requests: this module's own format (`session`, `parts` with
    `hash` and `tokens`, `output_tokens`; docs/tune.md), or the gateway's request log
    (docs/gateway.md), whose lengths are characters and are turned into tokens at the ratio
    the log's own `prompt_tokens` give. Lines are sessions' turns in the order they arrived."""
    text = read_text_capped(path, REPLAY_MAX_BYTES, "the replay", "see docs/tune.md")
    by_session: dict[str, list[Turn]] = {}
    characters = counted = 0
    logged: list[Turn] = []  # the gateway's lines, in characters until the end
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        found = _replay_line(line, f"{path}:{number}")
        if found is None:
            continue
        session, turn, prompt_tokens = found
        by_session.setdefault(session, []).append(turn)
        if prompt_tokens is not None:
            logged.append(turn)
            characters += turn.prompt_tokens
            counted += prompt_tokens
    if not by_session:
        raise TuneError(f"the replay {path} holds no requests", "record some first")
    # One ratio for the whole log, so equal parts stay equal tokens (shared prefixes).
    ratio = counted / characters if characters else 1.0
    scaled = {id(turn): _in_tokens(turn, ratio) for turn in logged}
    sessions = tuple(tuple(scaled.get(id(t), t) for t in turns) for turns in by_session.values())
    return Workload(f"replay:{path.name}", sessions)


def _in_tokens(turn: Turn, ratio: float) -> Turn:
    parts = tuple(Part(part.hash, max(1, round(part.tokens * ratio))) for part in turn.parts)
    return Turn(parts, turn.output_tokens)


def _replay_line(line: str, where: str) -> tuple[str, Turn, int | None] | None:
    """(session, the turn, the engine's prompt tokens for a gateway log line, else None)."""
    try:
        data = json.loads(line)
    except ValueError:
        raise TuneError(f"{where}: not a JSON object", "one request per line") from None
    if not isinstance(data, dict):
        raise TuneError(f"{where}: not a JSON object", "one request per line")
    if "parts" not in data and "messages" in data:
        return _gateway_line(data, where)
    parts = data.get("parts")
    if not isinstance(parts, list) or not parts:
        raise TuneError(f"{where}: 'parts' must be a list of {{hash, tokens}}", "see docs/tune.md")
    output = data.get("output_tokens")
    if not isinstance(output, int) or not _count(output):
        raise TuneError(f"{where}: 'output_tokens' must be a positive integer", "see docs/tune.md")
    return str(data.get("session", where)), Turn(tuple(_parts(parts, where)), output), None


def _parts(parts: list[Any], where: str) -> Iterator[Part]:
    for part in parts:
        if not isinstance(part, dict) or not _count(part.get("tokens")):
            raise TuneError(
                f"{where}: each part needs 'hash' and a positive 'tokens'", "see docs/tune.md"
            )
        yield Part(str(part.get("hash", "")), int(part["tokens"]))


def _gateway_line(data: dict[str, Any], where: str) -> tuple[str, Turn, int] | None:
    """A line of the gateway's request log (`gateway start --request-log`, docs/gateway.md):
    the system prompt, each tool and each message as a length in characters and a hash; the
    parts keep both (the caller turns characters into tokens). A session is one key, one
    model and the same first message, as `gateway analyze` groups them; refused or failed
    requests (status not 200) and lines without the engine's prompt count are left out."""
    if data.get("status", 200) != 200:
        return None
    prompt, output = data.get("prompt_tokens"), data.get("completion_tokens")
    if not isinstance(prompt, int) or not _count(prompt):
        return None  # no count from the engine: nothing to size the parts by
    system = data.get("system") if isinstance(data.get("system"), dict) else {}
    rows: list[tuple[str, int]] = []
    if system and _count(system.get("len")):
        rows.append((f"system:{system.get('hash')}", int(system["len"])))
    for tool in data.get("tools") or []:
        if isinstance(tool, list) and len(tool) >= 2 and _count(tool[0]):
            rows.append((f"tool:{tool[1]}", tool[0]))
    messages = [m for m in data.get("messages") or [] if isinstance(m, list) and len(m) >= 3]
    for role, length, digest in (m[:3] for m in messages):
        if _count(length):
            rows.append((f"{role}:{digest}", length))
    if not rows:
        raise TuneError(f"{where}: a request log line with no system, tools or messages", "")
    parts = tuple(Part(h, length) for h, length in rows)
    first = messages[0][2] if messages else where
    session = f"{data.get('key')}|{data.get('model')}|{first}"
    tokens = output if isinstance(output, int) and _count(output) else 1
    return session, Turn(parts, tokens), prompt


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 24
