"""Per-key limits and fair turns between keys on one engine.

Limits (a key's requests and tokens per minute, its concurrent requests) are checked before a
request is sent on: over one, the request is refused with 429 and Retry-After before any byte
of an answer exists, so a stream is either admitted whole or refused, never dropped midway.

Turns: a deployment runs at most `--max-num-seqs` sequences at once; past that, vLLM queues
requests first come, first served, so one key's 64 streams would put another key's single
request behind all of them. The gateway admits requests to a deployment up to that number,
and waiting requests are let in by key in turn (round-robin), not in arrival order. How many
of the C slots one key may hold (its share):

  - it is the only key seen on the deployment in the last 5 minutes: all C;
  - another key was seen there in the last 5 minutes: C - max(1, C // 4);
  - another key is busy there now (a request in flight, or one sent in the last 30 s):
    min(C - max(1, C // 4), max(1, floor(C * busy_share))), 32 of 64 at the default 0.5.
    Every sequence in the engine's batch slows the step each other request's prefill and
    first tokens share (and the engine's API server streams every one of them), so a
    flooding key's share is what another key's time to first token pays for.

First token first: when a request takes its slot while another key holds more slots than
its own key, it waits for its first token (the answer's first Server-Sent Event) with the
heavier keys' new requests held back, for at most `first_token_hold_s`: their prefills do
not land in the steps its prefill needs. A key holding fewer than max(1, C // 8) slots is
never held back, so a stream of other keys' requests cannot starve it.

A deployment whose max-num-seqs is not known is not held back (its engine queues).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from sm120.gateway.config import TurnPolicy
from sm120.gateway.keys import KeyEntry

WINDOW_S = 60.0
# Keys seen on a deployment this recently share it: no one of them takes every slot.
ACTIVE_KEY_S = 300.0
# Keys with a request in flight, or one sent this recently, are busy on it: the busy share.
BUSY_KEY_S = 30.0
# A request waits this long for its turn, then is refused (429, Retry-After) before it starts.
TURN_WAIT_S = 120.0


@dataclass(frozen=True)
class Refusal:
    reason: str  # "rpm", "tpm", "concurrency", "busy"
    message: str
    retry_after: int


@dataclass
class KeyUse:
    """One key's last minute and what it has in flight."""

    started: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    token_sum: int = 0
    in_flight: int = 0

    def prune(self, now: float) -> None:
        edge = now - WINDOW_S
        while self.started and self.started[0] <= edge:
            self.started.popleft()
        while self.tokens and self.tokens[0][0] <= edge:
            self.token_sum -= self.tokens.popleft()[1]


class Limits:
    """Every key's use, on the gateway's event loop (no locks: one thread touches it)."""

    def __init__(self) -> None:
        self.uses: dict[str, KeyUse] = {}

    def admit(self, entry: KeyEntry, now: float | None = None) -> Refusal | None:
        """Count a request in, or say why it may not start. Admitted requests must `leave`."""
        now = time.monotonic() if now is None else now
        use = self.uses.setdefault(entry.name, KeyUse())
        use.prune(now)
        if entry.concurrency is not None and use.in_flight >= entry.concurrency:
            return Refusal(
                "concurrency",
                f"key '{entry.name}' has {use.in_flight} requests in flight, its limit",
                1,
            )
        if entry.rpm is not None and len(use.started) >= entry.rpm:
            wait = WINDOW_S - (now - use.started[0])
            message = f"key '{entry.name}' used its {entry.rpm} requests per minute"
            return Refusal("rpm", message, max(1, math.ceil(wait)))
        if entry.tpm is not None and use.token_sum >= entry.tpm:
            wait = WINDOW_S - (now - use.tokens[0][0])
            message = f"key '{entry.name}' used its {entry.tpm} tokens per minute"
            return Refusal("tpm", message, max(1, math.ceil(wait)))
        use.started.append(now)
        use.in_flight += 1
        return None

    def unadmit(self, name: str, at: float) -> None:
        """Take back an admission whose request another path serves (and admits) instead."""
        use = self.uses.get(name)
        if use is None:
            return
        with contextlib.suppress(ValueError):
            use.started.remove(at)
        self.leave(name)

    def leave(self, name: str) -> None:
        use = self.uses.get(name)
        if use is not None and use.in_flight > 0:
            use.in_flight -= 1

    def spent(self, name: str, tokens: int, now: float | None = None) -> None:
        """Tokens a finished request used (prompt and completion), for tokens per minute."""
        if tokens <= 0:
            return
        use = self.uses.setdefault(name, KeyUse())
        use.tokens.append((time.monotonic() if now is None else now, tokens))
        use.token_sum += tokens


def busy_share_of(capacity: int, busy_share: float) -> int:
    """The most of `capacity` slots one key may hold while another key is busy too."""
    reserve = capacity - max(1, capacity // 4)
    return max(1, min(reserve, math.floor(capacity * busy_share)))


class Turns:
    """One deployment's slots, let out by key in turn."""

    def __init__(self, capacity: int | None, policy: TurnPolicy | None = None) -> None:
        self.capacity = capacity
        self.policy = policy or TurnPolicy()
        self.held: dict[str, int] = {}
        self.total = 0
        self.seen: dict[str, float] = {}
        self._active = 0
        self._busy = 0
        self._counted_at = float("-inf")
        self._seen_count = 0
        # Key -> its waiting requests, in key order of first wait (rotated as served).
        self.waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        # Requests waiting for their first token (first token first): id -> (key, deadline).
        self.firsts: dict[int, tuple[str, float]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._last_first = 0

    def share(self, now: float) -> int:
        """The most slots one key may hold now."""
        assert self.capacity is not None
        if now - self._counted_at > 1.0 or len(self.seen) != self._seen_count:
            # Counted at most once a second (or when a key shows up), not per request.
            edge, busy_edge = now - ACTIVE_KEY_S, now - BUSY_KEY_S
            self._active = sum(1 for at in self.seen.values() if at > edge)
            self._busy = sum(
                1 for key, at in self.seen.items() if at > busy_edge or self.held.get(key, 0)
            )
            self._counted_at, self._seen_count = now, len(self.seen)
        if self._active <= 1 or self.capacity < 2:
            return self.capacity
        if self._busy >= 2:
            return busy_share_of(self.capacity, self.policy.busy_share)
        return self.capacity - max(1, self.capacity // 4)

    def _may_enter(self, key: str, now: float) -> bool:
        if self.capacity is None:
            return True
        if self.total >= self.capacity or self.held.get(key, 0) >= self.share(now):
            return False
        return not (self.firsts and self._held_back(key, now))

    def _held_back(self, key: str, now: float) -> bool:
        """A lighter key's request waits for its first token: this heavier key waits too."""
        assert self.capacity is not None
        mine = self.held.get(key, 0)
        if mine < max(1, self.capacity // 8):
            return False
        held_back = False
        for token, (other, deadline) in list(self.firsts.items()):
            if deadline <= now:
                self.firsts.pop(token)
            elif other != key and self.held.get(other, 0) < mine:
                held_back = True
        return held_back

    def try_enter(self, key: str, now: float | None = None) -> bool:
        """Take a slot at once when one is free for this key and nobody of it waits."""
        now = time.monotonic() if now is None else now
        last = self.seen.get(key)
        if last is None or now - last > BUSY_KEY_S:
            self._counted_at = float("-inf")  # a key busy again: the shares change now
        self.seen[key] = now
        if key in self.waiting or not self._may_enter(key, now):
            return False
        self._take(key)
        return True

    async def enter(self, key: str, timeout: float = TURN_WAIT_S) -> bool:
        """Wait for this key's turn; False when none came within `timeout`."""
        if self.try_enter(key):
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(key, deque()).append(turn)
        try:
            await asyncio.wait_for(asyncio.shield(turn), timeout)
        except asyncio.TimeoutError:
            return self._give_up(key, turn)
        except asyncio.CancelledError:
            if self._give_up(key, turn):
                self.leave(key)  # the slot came as the wait was cancelled: hand it on
            raise
        return True

    def _give_up(self, key: str, turn: asyncio.Future[None]) -> bool:
        """Stop waiting; True when the slot had been given all the same."""
        if turn.done() and not turn.cancelled():
            return True
        turn.cancel()
        self._forget(key, turn)
        return False

    def leave(self, key: str) -> None:
        held = self.held.get(key, 0)
        if held <= 0:
            return
        self.held[key] = held - 1
        self.total -= 1
        self._let_in(time.monotonic())

    # --- first token first ---
    def await_first_token(self, key: str, now: float | None = None) -> int | None:
        """A request of `key` has its slot: when another key holds more slots, it waits for
        its first token with theirs held back. The id for `first_token`, or None."""
        hold = self.policy.first_token_hold_s
        if hold <= 0 or self.capacity is None or len(self.held) < 2:
            return None
        mine = self.held.get(key, 0)
        if not any(n > mine for other, n in self.held.items() if other != key):
            return None
        now = time.monotonic() if now is None else now
        self._last_first += 1
        token = self._last_first
        self.firsts[token] = (key, now + hold)
        with contextlib.suppress(RuntimeError):  # no loop (a plain test): no timer
            loop = asyncio.get_running_loop()
            self._timers[token] = loop.call_later(hold, self.first_token, token)
        return token

    def first_token(self, token: int) -> None:
        """The request's first token came (or its hold ran out, or it ended): the keys it
        held back may go on."""
        timer = self._timers.pop(token, None)
        if timer is not None:
            timer.cancel()
        if self.firsts.pop(token, None) is not None:
            self._let_in(time.monotonic())

    def _take(self, key: str) -> None:
        self.held[key] = self.held.get(key, 0) + 1
        self.total += 1

    def _let_in(self, now: float) -> None:
        """Give free slots to waiting keys in turn: the first key in line that may enter gets
        one, then goes to the back of the line."""
        progress = True
        while progress and self.waiting:
            progress = False
            for key in list(self.waiting):
                if not self._may_enter(key, now):
                    continue
                queue = self.waiting[key]
                turn = queue.popleft()
                if not queue:
                    del self.waiting[key]
                else:
                    self.waiting.move_to_end(key)
                if turn.done():  # given up already
                    progress = True
                    break
                self._take(key)
                turn.set_result(None)
                progress = True
                break

    def _forget(self, key: str, turn: asyncio.Future[None]) -> None:
        queue = self.waiting.get(key)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(turn)
        if not queue:
            del self.waiting[key]

    def waiting_count(self) -> int:
        return sum(len(q) for q in self.waiting.values())


class TurnTable:
    """Every deployment's turns, made as deployments are first asked for."""

    def __init__(self, policy: TurnPolicy | None = None) -> None:
        self.policy = policy or TurnPolicy()
        self.by_deployment: dict[str, Turns] = {}

    def of(self, deployment: str, capacity: int | None) -> Turns:
        turns = self.by_deployment.get(deployment)
        if turns is None or turns.capacity != capacity:
            turns = Turns(capacity, self.policy) if turns is None else _resized(turns, capacity)
            self.by_deployment[deployment] = turns
        return turns


def _resized(turns: Turns, capacity: int | None) -> Turns:
    # A relaunch with another max-num-seqs: the same slots, counted against the new number.
    turns.capacity = capacity
    turns._let_in(time.monotonic())
    return turns
