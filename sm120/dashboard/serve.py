"""`sm120 dashboard` with no gateway: the dashboard's routes alone, in this process, until
SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import aiohttp
from aiohttp import web

from sm120.dashboard.controls import Controls
from sm120.dashboard.routes import add_dashboard


def serve_dashboard(
    host: str,
    port: int,
    api_key: str,
    controls_for: Callable[[aiohttp.ClientSession], Controls],
) -> None:
    asyncio.run(_serve(host, port, api_key, controls_for))


async def _serve(
    host: str,
    port: int,
    api_key: str,
    controls_for: Callable[[aiohttp.ClientSession], Controls],
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, stop.set)
    async with aiohttp.ClientSession() as session:
        app = web.Application()
        add_dashboard(app, api_key, controls_for(session))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            await stop.wait()
        finally:
            await runner.cleanup()
