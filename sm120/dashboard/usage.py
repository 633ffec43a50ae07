"""The dashboard's usage view: requests and tokens per key over the last day, and the latest
requests (key, model, status, tokens, TTFT). Its data is handed in (the gateway reads its
usage database, sm120.gateway.panel), as the buttons are: the dashboard cannot import the
gateway. Key names and models are a client's text: the page sets them as text, never HTML."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from sm120.dashboard.routes import ACCESS, PREFIX

UsageSource = Callable[[], dict[str, Any]]
USAGE: web.AppKey[UsageSource] = web.AppKey("dashboard_usage")


def add_usage_view(app: web.Application, source: UsageSource) -> None:
    """`source()` runs off the event loop and returns {"by_key": [...], "recent": [...]}."""
    app[USAGE] = source
    app.router.add_get(f"{PREFIX}/api/usage", _usage)


async def _usage(request: web.Request) -> web.Response:
    if not request.app[ACCESS].allows(request):
        return web.json_response({"error": "missing or wrong key"}, status=401)
    try:
        found = await asyncio.to_thread(request.app[USAGE])
    except Exception as exc:  # a database being written or gone: the view says so, not a 500
        found = {"by_key": [], "recent": [], "problem": f"{type(exc).__name__}: {exc}"[:200]}
    return web.json_response(found)
