"""A gateway in this process in front of scripted backends (fast unit tests of routing,
errors and swaps; the real engines are in tests/integration/test_gateway_realstack.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from sm120.core.errors import SM120Error
from sm120.gateway.aliases import Alias
from sm120.gateway.backends import Backend
from sm120.gateway.front import serving_front
from sm120.gateway.proxy import build_app
from sm120.gateway.swap import Swapper, SwapPolicy

GATEWAY_KEY = "gateway-test-key"


def backend(model: str, base_url: str, **fields: Any) -> Backend:
    values: dict[str, Any] = {
        "model": model,
        "deployment": f"dep-{model}",
        "base_url": base_url,
        "api_key": None,
        "running": True,
        "startable": True,
        "sleep_mode": False,
    }
    values.update(fields)
    return Backend(**values)


class FakeActions:
    """Swap actions on a table of backends: what was done, in order; optionally slow or failing."""

    def __init__(self, table: dict[str, Backend], delay_s: float = 0.0) -> None:
        self.table = table
        self.delay_s = delay_s
        self.done: list[str] = []
        self.fail_start: str | None = None
        # What the engines say when asked whether they sleep.
        self.sleeping: set[str] = set()

    def _set(self, target: Backend, running: bool) -> None:
        self.table[target.model] = dataclasses.replace(target, running=running)

    async def stop(self, target: Backend) -> None:
        self.done.append(f"stop {target.deployment}")
        self._set(target, False)

    async def start(self, target: Backend, timeout_s: float) -> None:
        self.done.append(f"start {target.deployment}")
        await asyncio.sleep(self.delay_s)
        if self.fail_start:
            raise SM120Error(self.fail_start, "see the log")
        self._set(target, True)

    async def sleep(self, target: Backend) -> None:
        self.done.append(f"sleep {target.deployment}")
        self.sleeping.add(target.deployment)

    async def wake(self, target: Backend) -> None:
        self.done.append(f"wake {target.deployment}")
        self.sleeping.discard(target.deployment)

    async def is_sleeping(self, target: Backend) -> bool:
        return target.deployment in self.sleeping


@contextlib.asynccontextmanager
async def running_gateway(
    table: dict[str, Backend],
    policy: SwapPolicy,
    actions: FakeActions,
    aliases: tuple[Alias, ...] = (),
    rewrite: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
) -> AsyncIterator[tuple[aiohttp.ClientSession, Swapper]]:
    async def discover() -> dict[str, Backend]:
        return dict(table)

    upstream = aiohttp.ClientSession(auto_decompress=False)
    swapper = Swapper(policy, actions, discover)
    app = build_app(GATEWAY_KEY, swapper, upstream, aliases, rewrite)
    server = TestServer(app)
    await server.start_server()
    # As `sm120 gateway` runs: the front listens, the application answers what it hands over.
    internal = (server.host, server.port)
    assert internal[1] is not None
    async with serving_front(app, GATEWAY_KEY, (internal[0], internal[1]), "127.0.0.1", 0) as front:
        client = aiohttp.ClientSession(
            base_url=f"http://127.0.0.1:{front.port}/",
            headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
        )
        try:
            yield client, swapper
        finally:
            await client.close()
            await server.close()
            await upstream.close()


async def exchange(
    table: dict[str, Backend],
    policy: SwapPolicy,
    actions: FakeActions,
    method: str,
    path: str,
    aliases: tuple[Alias, ...] = (),
    **request: Any,
) -> tuple[int, dict[str, str], bytes]:
    """One request through a fresh gateway: its status, headers and body."""
    async with (
        running_gateway(table, policy, actions, aliases) as (client, _),
        client.request(method, path, **request) as answer,
    ):
        return answer.status, dict(answer.headers), await answer.read()
