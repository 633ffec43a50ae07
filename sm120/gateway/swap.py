"""Bringing the asked model up when it is not: put another to sleep (or stop it), then wake
(or start) the asked one, one swap at a time.

Requests wait for a swap a bounded time; past it they get 503 with Retry-After while the
swap goes on (a start interrupted half-way would cost the next request a cold start).
`max_awake` is the operator's word for "this many fit at once": 0 means the gateway never
starts, stops, sleeps or wakes anything.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from sm120.core.errors import SM120Error
from sm120.gateway.backends import Backend
from sm120.gateway.config import DEFAULT_SWAP_WAIT_S

# What Retry-After says when the swap is still under way.
RETRY_AFTER_S = 30
# In-flight requests on a deployment about to be put away get this long to finish.
DRAIN_S = 30.0


class SwapFailed(SM120Error):
    """The asked model cannot be brought up now (503; Retry-After when trying later helps)."""

    def __init__(self, message: str, hint: str | None = None, retry_after: int | None = None):
        super().__init__(message, hint)
        self.retry_after = retry_after


@dataclass(frozen=True)
class SwapPolicy:
    max_awake: int = 0
    wait_s: float = DEFAULT_SWAP_WAIT_S
    drain_s: float = DRAIN_S


class SwapActions(Protocol):
    """What a swap does to a deployment; the real ones are sm120's lifecycle (actions.py)."""

    async def stop(self, backend: Backend) -> None: ...

    async def start(self, backend: Backend, timeout_s: float) -> None: ...

    async def sleep(self, backend: Backend) -> None: ...

    async def wake(self, backend: Backend) -> None: ...

    async def is_sleeping(self, backend: Backend) -> bool: ...


Discover = Callable[[], Awaitable[dict[str, Backend]]]


@dataclass
class Swapper:
    policy: SwapPolicy
    actions: SwapActions
    discover: Discover
    # Deployments this gateway put to sleep: they run, but cannot answer until woken.
    asleep: set[str] = field(default_factory=set)
    in_flight: Counter[str] = field(default_factory=Counter)
    last_used: dict[str, float] = field(default_factory=dict)
    # Counts swaps begun and ended: a routing table read before either is out of date.
    swap_events: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _swaps: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def awake(self, backend: Backend) -> bool:
        return backend.running and backend.deployment not in self.asleep

    async def observe(self, backends: dict[str, Backend]) -> None:
        """Ask each running sleep-mode engine whether it sleeps: one put to sleep before this
        gateway started (or by hand) is known as asleep, one woken by hand as awake."""
        sleepers = [b for b in backends.values() if b.running and b.sleep_mode]
        answers = await asyncio.gather(*(self.actions.is_sleeping(b) for b in sleepers))
        for sleeper, sleeping in zip(sleepers, answers, strict=True):
            if sleeping:
                self.asleep.add(sleeper.deployment)
            else:
                self.asleep.discard(sleeper.deployment)

    def used(self, backend: Backend) -> None:
        self.last_used[backend.deployment] = time.monotonic()

    async def ensure_awake(self, backend: Backend) -> None:
        """Return once the backend serves, or raise SwapFailed."""
        if self.awake(backend):
            return
        if self.policy.max_awake == 0:
            raise SwapFailed(
                f"model '{backend.model}' is not running (deployment {backend.deployment})",
                f"start it (sm120 launch ... --name {backend.deployment}), or let the gateway "
                "swap: sm120 gateway start --max-awake N",
            )
        if not backend.startable and not (backend.running and backend.sleep_mode):
            raise SwapFailed(
                f"model '{backend.model}' is not running and the gateway cannot start it",
                f"deployment {backend.deployment} saved no launch spec: launch it again once",
            )
        swap = self._swaps.get(backend.deployment)
        if swap is None or swap.done():
            swap = asyncio.ensure_future(self._swap_in(backend.model))
            self._swaps[backend.deployment] = swap
        try:
            # Shielded: a client giving up or timing out must not cancel a half-done start.
            await asyncio.wait_for(asyncio.shield(swap), self.policy.wait_s)
        except asyncio.TimeoutError:
            raise SwapFailed(
                f"model '{backend.model}' is still being started after {self.policy.wait_s:.0f} s",
                f"retry in {RETRY_AFTER_S} s",
                retry_after=RETRY_AFTER_S,
            ) from None
        except SwapFailed:
            raise
        except SM120Error as exc:
            raise SwapFailed(
                f"switching to '{backend.model}' failed: {exc.message}",
                exc.hint,
                retry_after=RETRY_AFTER_S,
            ) from None

    async def _swap_in(self, model: str) -> None:
        async with self._lock:
            self.swap_events += 1
            try:
                await self._swap_in_locked(model)
            finally:
                self.swap_events += 1

    async def _swap_in_locked(self, model: str) -> None:
        backends = await self.discover()
        await self.observe(backends)
        target = backends.get(model)
        if target is None:
            raise SwapFailed(f"model '{model}' is gone", "see 'sm120 status'")
        if self.awake(target):
            return
        await self._make_room(target, backends)
        if target.running and target.sleep_mode:
            await self.actions.wake(target)
            self.asleep.discard(target.deployment)
        else:
            await self.actions.start(target, self.policy.wait_s)
        self.used(target)

    async def _make_room(self, target: Backend, backends: dict[str, Backend]) -> None:
        others = [b for b in backends.values() if self.awake(b) and b is not target]
        # Only what the gateway can bring back again may be put away, least recently used first.
        movable = sorted(
            (b for b in others if b.startable or b.sleep_mode),
            key=lambda b: self.last_used.get(b.deployment, 0.0),
        )
        while len(others) >= self.policy.max_awake:
            if not movable:
                names = ", ".join(b.deployment for b in others)
                raise SwapFailed(
                    f"no room for '{target.model}': {names} already run and the gateway "
                    "cannot start them again",
                    "stop one (sm120 stop NAME), or raise --max-awake",
                )
            victim = movable.pop(0)
            await self._drain(victim)
            if victim.sleep_mode:
                await self.actions.sleep(victim)
                self.asleep.add(victim.deployment)
            else:
                await self.actions.stop(victim)
            others.remove(victim)

    async def _drain(self, backend: Backend) -> None:
        deadline = time.monotonic() + self.policy.drain_s
        while self.in_flight[backend.deployment] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
