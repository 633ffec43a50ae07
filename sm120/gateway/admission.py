"""The one key check and admission both of the gateway's paths go through: the fast path
(sm120.gateway.front) and the application (sm120.gateway.proxy) call the same functions, so
neither can answer a request differently from the other. A per-deployment front in front of
an engine can reuse `Team` as it is: it needs a key ring and nothing of the routing.

Order: who (one credential, a known key, not expired) -> which model (a key may use only its
models; any other is the same 404 as a model that does not exist) -> its limits (429) -> its
turn on the deployment (queued; 429 if none comes) -> served, watched -> recorded.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from sm120.gateway.config import TurnPolicy
from sm120.gateway.keys import AMBIGUOUS, KeyEntry, KeyRing, presented_credential
from sm120.gateway.limits import Limits, Refusal, Turns, TurnTable
from sm120.gateway.meter import Meter
from sm120.gateway.usage import Record, Tap, UsageWriter

WRONG_KEY = "missing or wrong API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')"
TWO_KEYS = (
    "two different credentials in one request (send one key, in 'Authorization: Bearer KEY' "
    "or 'x-api-key: KEY')"
)
ANTHROPIC_PROTOCOLS = frozenset({"messages", "count_tokens"})


@dataclass(frozen=True)
class Unauthorized:
    message: str


def error_body(protocol: str, status: int, message: str, kind: str, **extra: object) -> bytes:
    """An error in the shape the protocol's SDK parses: Anthropic's for Messages, OpenAI's
    (the gateway's usual) for everything else."""
    if protocol in ANTHROPIC_PROTOCOLS:
        anthropic_kind = "rate_limit_error" if status == 429 else kind
        body: dict[str, object] = {
            "type": "error", "error": {"type": anthropic_kind, "message": message, **extra}
        }  # fmt: skip
    else:
        body = {"error": {"message": message, "type": kind, "code": status, **extra}}
    return json.dumps(body).encode()


def refusal_headers(refusal: Refusal) -> dict[str, str]:
    return {"Retry-After": str(refusal.retry_after)}


def refusal_body(protocol: str, refusal: Refusal, key: str) -> bytes:
    return error_body(
        protocol, 429, refusal.message, "rate_limit_exceeded", reason=refusal.reason, key=key
    )


def refusal_bytes(protocol: str, refusal: Refusal, key: str) -> bytes:
    """The 429 as a whole HTTP/1.1 answer, for the fast path."""
    body = refusal_body(protocol, refusal, key)
    head = (
        f"HTTP/1.1 429 {HTTPStatus(429).phrase}\r\n"
        f"Content-Type: application/json; charset=utf-8\r\nRetry-After: {refusal.retry_after}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Ticket:
    """One admitted request, until it is recorded."""

    entry: KeyEntry
    deployment: str
    model: str
    protocol: str
    turns: Turns | None
    started: float = field(default_factory=time.monotonic)
    tap: Tap = field(default_factory=Tap)
    held_turn: bool = False
    # Its id among the requests waiting for a first token (first token first), if it is one.
    first: int | None = None
    done: bool = False
    body: dict[str, Any] | None = None  # kept only for the opt-in request log


class Team:
    """Keys, limits, turns, usage and the per-key counters, for one gateway."""

    def __init__(
        self, ring: KeyRing, usage: UsageWriter | None = None, meter: Meter | None = None,
        policy: TurnPolicy | None = None,
    ) -> None:  # fmt: skip
        self.ring = ring
        self.limits = Limits()
        self.turns = TurnTable(policy)
        self.usage = usage
        self.meter = meter or Meter()

    # --- who ---
    def identify(self, headers: Iterable[tuple[str, str]]) -> KeyEntry | Unauthorized:
        credential = presented_credential(headers)
        if credential is AMBIGUOUS:
            self.meter.refused("?", "ambiguous")
            return Unauthorized(TWO_KEYS)
        assert isinstance(credential, bytes)
        entry = self.ring.lookup(credential)
        if entry is None:
            return Unauthorized(WRONG_KEY)
        if entry.expired(time.time()):
            self.meter.refused(entry.name, "expired")
            return Unauthorized(f"the key '{entry.name}' expired after {entry.expires}")
        return entry

    # --- limits and turns ---
    @property
    def logs_requests(self) -> bool:
        return self.usage is not None and self.usage.request_log is not None

    def admit(
        self, entry: KeyEntry, deployment: str, capacity: int | None, model: str, protocol: str,
        body: dict[str, Any] | None = None,
    ) -> Ticket | Refusal:  # fmt: skip
        now = time.monotonic()
        refusal = self.limits.admit(entry, now)
        if refusal is not None:
            self.meter.refused(entry.name, refusal.reason)
            return refusal
        turns = self.turns.of(deployment, capacity)
        ticket = Ticket(entry, deployment, model, protocol, turns, now)
        if self.logs_requests:
            ticket.body = body
        return ticket

    def take_turn(self, ticket: Ticket) -> bool:
        """A slot at once, or False: then `wait_turn`."""
        assert ticket.turns is not None
        ticket.held_turn = ticket.turns.try_enter(ticket.entry.name)
        if ticket.held_turn:
            self._await_first(ticket)
        return ticket.held_turn

    async def wait_turn(self, ticket: Ticket) -> Refusal | None:
        """Wait in the key's queue; a client gone meanwhile (cancelled) leaves no count."""
        assert ticket.turns is not None
        try:
            ticket.held_turn = await ticket.turns.enter(ticket.entry.name)
        except asyncio.CancelledError:
            self.withdraw(ticket)
            raise
        if ticket.held_turn:
            self.meter.waited(ticket.entry.name, time.monotonic() - ticket.started)
            self._await_first(ticket)
            return None
        self.limits.leave(ticket.entry.name)
        ticket.turns = None
        message = f"deployment {ticket.deployment} is busy: no turn came for this request"
        self.meter.refused(ticket.entry.name, "busy")
        return Refusal("busy", message, 1)

    @staticmethod
    def _await_first(ticket: Ticket) -> None:
        """First token first: the tap says when the answer's first event passes."""
        assert ticket.turns is not None
        first = ticket.turns.await_first_token(ticket.entry.name)
        if first is not None:
            ticket.first = first
            ticket.tap.on_first = functools.partial(ticket.turns.first_token, first)

    @staticmethod
    def _leave_turn(ticket: Ticket) -> None:
        turns, ticket.turns = ticket.turns, None
        if turns is None or not ticket.held_turn:
            return
        if ticket.first is not None:
            ticket.tap.on_first = None
            turns.first_token(ticket.first)  # ended without one: the hold ends too
        turns.leave(ticket.entry.name)

    # --- done ---
    def withdraw(self, ticket: Ticket) -> None:
        """The fast path handed the request to the application, which admits it anew."""
        if ticket.done:
            return
        ticket.done = True
        self._leave_turn(ticket)
        self.limits.unadmit(ticket.entry.name, ticket.started)

    def finish(self, ticket: Ticket, status: int = 0) -> None:
        if ticket.done:
            return
        ticket.done = True
        self._leave_turn(ticket)
        name = ticket.entry.name
        self.limits.leave(name)
        record = Record.of(name, ticket.model, ticket.protocol, ticket.started, ticket.tap, status)
        record.body = ticket.body
        self.meter.answered(name, ticket.model, record.status)
        if self.usage is not None:
            self.usage.put(record)

    def refusal_recorded(self, entry: KeyEntry, model: str, protocol: str, status: int) -> None:
        """A request refused before it reached an engine (404, 429) is usage too."""
        record = Record.of(entry.name, model, protocol, time.monotonic(), None, status)
        self.meter.answered(entry.name, model, status)
        if self.usage is not None:
            self.usage.put(record)

    def recorded(self, record: Record) -> None:
        """A record the usage writer parsed (hopped onto the loop): its tokens count against
        the key's tokens per minute and in the counters."""
        completion = record.completion_tokens
        if completion is None:
            # A chat stream the engine sent no usage for: about a token an event (less the
            # role chunk and [DONE]), so tokens per minute still hold. Not written as usage.
            completion = max(record.events - 2, 0)
        self.limits.spent(record.key, (record.prompt_tokens or 0) + completion)
        self.meter.tokens(record)
