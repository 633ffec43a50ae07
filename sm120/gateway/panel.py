"""The dashboard's buttons on the gateway's own actions (actions.py, restart.py) and its
swapper: a deployment put to sleep from the page is one the gateway knows to be asleep."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from sm120.core.errors import SM120Error
from sm120.dashboard.controls import Action
from sm120.dashboard.routes import add_dashboard
from sm120.dashboard.usage import add_usage_view
from sm120.gateway.actions import EngineActions
from sm120.gateway.backends import Backend, discover
from sm120.gateway.control import gateway_status
from sm120.gateway.files import gateway_files
from sm120.gateway.swap import Swapper, SwapPolicy
from sm120.gateway.usage import recent, summary

# A relaunch waits for READY as long as `sm120 launch` would for a warm start.
RELAUNCH_TIMEOUT_S = 900.0
USAGE_VIEW_S = 86400.0
RECENT_ROWS = 20


class UnknownDeployment(SM120Error):
    """The page named a deployment the gateway cannot find."""


class NoLaunchRecord(SM120Error):
    """Relaunch asked of a deployment whose launch spec is missing or damaged."""


class SwapperControls:
    """sm120.dashboard.controls.Controls for the gateway, or for `sm120 dashboard` alone."""

    def __init__(self, swapper: Swapper) -> None:
        self.swapper = swapper

    async def act(self, action: Action, deployment: str) -> None:
        backend = await self._backend(deployment)
        actions, asleep = self.swapper.actions, self.swapper.asleep
        if action == "sleep":
            await actions.sleep(backend)
            asleep.add(deployment)
        elif action == "wake":
            await actions.wake(backend)
            asleep.discard(deployment)
        elif action == "stop":
            await actions.stop(backend)
            asleep.discard(deployment)
        else:
            if not backend.startable:
                # Stopping first would leave it down: refuse before touching it.
                raise NoLaunchRecord(
                    f"'{deployment}' kept no usable launch record, so it cannot be started "
                    "again from here; nothing was stopped",
                    f"relaunch it with 'sm120 launch <recipe> --name {deployment}'",
                )
            if backend.running:
                await actions.stop(backend)
            asleep.discard(deployment)
            await actions.start(backend, RELAUNCH_TIMEOUT_S)
        self.swapper.swap_events += 1

    async def sleepers(self) -> dict[str, bool]:
        backends = await self.swapper.discover()
        await self.swapper.observe(backends)
        return {
            b.deployment: b.deployment in self.swapper.asleep
            for b in backends.values()
            if b.sleep_mode
        }

    def gateway(self) -> dict[str, object] | None:
        current = gateway_status(gateway_files())
        return current.as_dict() if current.running else None

    async def _backend(self, deployment: str) -> Backend:
        for backend in (await self.swapper.discover()).values():
            if backend.deployment == deployment:
                return backend
        raise UnknownDeployment(
            f"no deployment named '{deployment}' serves or can serve again",
            "see 'sm120 status'",
        )


def add_dashboard_for(app: web.Application, api_key: str, swapper: Swapper) -> None:
    """The gateway's app serves the dashboard too, behind the gateway's key, with its usage."""
    add_dashboard(app, api_key, SwapperControls(swapper))
    add_usage_view(app, usage_for_the_page)


def usage_for_the_page() -> dict[str, object]:
    """The last day per key and the latest requests, from the gateway's usage database."""
    path = gateway_files(create=False).usage_db
    if not path.is_file():
        return {"by_key": [], "recent": []}
    since = time.time() - USAGE_VIEW_S
    return {"by_key": summary(path, "key", since), "recent": recent(path, RECENT_ROWS)}


async def _discover_off_loop() -> dict[str, Backend]:
    # Reading state files and /proc blocks: the event loop keeps serving the page.
    return await asyncio.to_thread(discover)


def standalone_controls(session: aiohttp.ClientSession) -> SwapperControls:
    """The controls of `sm120 dashboard` with no gateway: the same actions, a swapper that
    never swaps on its own (max_awake 0)."""
    return SwapperControls(Swapper(SwapPolicy(), EngineActions(session), _discover_off_loop))
