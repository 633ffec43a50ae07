"""The dashboard's routes on an aiohttp application: the page (or the login prompt), its
vendored static files, the JSON snapshot the page polls, and the actions. The gateway's own
middleware guards /v1 only, so each route here checks the key itself."""

from __future__ import annotations

import asyncio
import time
from importlib import resources
from typing import Any

from aiohttp import web

from sm120.core.errors import SM120Error
from sm120.dashboard.access import Access
from sm120.dashboard.controls import ACTIONS, Controls
from sm120.dashboard.snapshot import snapshot
from sm120.deploy.status import describe
from sm120.engine.state import DeploymentState

PREFIX = "/dashboard"
# Scripts and styles from this origin only (no inline code, no CDN), no frames, no plugins.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# The static files by name, with their content types: nothing else under static/ is served.
STATIC = {
    "dashboard.js": "text/javascript",
    "usage.js": "text/javascript",
    "dashboard.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE": "text/plain",
}
WRONG_KEY_SLOT = b"<!-- wrong key -->"
WRONG_KEY_NOTE = b'<p class="error" role="alert">That key is not the gateway key.</p>'
# Several open pages poll every two seconds: they share one reading of the state.
SNAPSHOT_TTL_S = 1.0
# A status row asks the engine's /health and /metrics, each through a new HTTP client
# (measured: ~25 ms of CPU per client, 2.4% of a core at one row per poll). The figures that
# move (tok/s, KV, queue, phase) come from the monitor's live view on every poll; the row
# itself is read again after this long, or at once after an action.
STATUS_ROW_TTL_S = 10.0


class Board:
    """The controls handed in, the shared snapshot, and which deployment an action holds."""

    def __init__(self, controls: Controls, ttl_s: float = SNAPSHOT_TTL_S) -> None:
        self.controls = controls
        self.busy: dict[str, str] = {}
        self._rows: dict[str, tuple[float, DeploymentState, dict[str, Any]]] = {}
        self._ttl_s = ttl_s
        self._taken_at = float("-inf")
        self._last: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def snapshot(self) -> dict[str, Any]:
        async with self._lock:
            if time.monotonic() - self._taken_at > self._ttl_s:
                sleepers = await self.controls.sleepers()
                gateway = self.controls.gateway()
                self._last = await asyncio.to_thread(snapshot, sleepers, gateway, self._row)
                self._taken_at = time.monotonic()
        for row in self._last["deployments"]:
            row["action"] = self.busy.get(row["name"])
        return self._last

    def forget(self) -> None:
        self._taken_at = float("-inf")
        self._rows.clear()

    def _row(self, state: DeploymentState) -> dict[str, Any]:
        """The status row, reused while the deployment is the same one (a relaunch by hand
        writes a new state) and younger than STATUS_ROW_TTL_S."""
        now = time.monotonic()
        kept = self._rows.get(state.name)
        if kept is None or kept[1] != state or now - kept[0] > STATUS_ROW_TTL_S:
            kept = (now, state, describe(state))
            self._rows[state.name] = kept
        return kept[2]


ACCESS: web.AppKey[Access] = web.AppKey("dashboard_access", Access)
BOARD: web.AppKey[Board] = web.AppKey("dashboard_board", Board)


def add_dashboard(app: web.Application, api_key: str, controls: Controls) -> None:
    app[ACCESS] = Access(api_key)
    app[BOARD] = Board(controls)
    app.router.add_get(PREFIX, _page)
    app.router.add_post(f"{PREFIX}/login", _login)
    app.router.add_post(f"{PREFIX}/logout", _logout)
    app.router.add_get(PREFIX + "/static/{name}", _static)
    app.router.add_get(f"{PREFIX}/api/snapshot", _snapshot)
    app.router.add_post(f"{PREFIX}/api/actions", _action)
    app.on_response_prepare.append(_security_headers)


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    if not request.path.startswith(PREFIX):
        return
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    if not request.path.startswith(f"{PREFIX}/static/"):
        response.headers["Cache-Control"] = "no-store"


def _asset(name: str) -> bytes:
    return resources.files("sm120.dashboard").joinpath("static").joinpath(name).read_bytes()


def _html(name: str, status: int = 200) -> web.Response:
    return web.Response(body=_asset(name), status=status, content_type="text/html", charset="utf-8")


async def _page(request: web.Request) -> web.Response:
    if request.app[ACCESS].allows(request):
        return _html("index.html")
    # Without the key: the login prompt and nothing else (no data, no script).
    return _html("login.html", status=401)


async def _login(request: web.Request) -> web.Response:
    form = await request.post()
    given = form.get("key")
    access = request.app[ACCESS]
    if not isinstance(given, str) or not access.is_key(given):
        wrong = _asset("login.html").replace(WRONG_KEY_SLOT, WRONG_KEY_NOTE)
        return web.Response(body=wrong, status=401, content_type="text/html", charset="utf-8")
    signed_in = web.HTTPSeeOther(PREFIX)
    access.open_session(signed_in, PREFIX)
    raise signed_in


async def _logout(request: web.Request) -> web.Response:
    signed_out = web.HTTPSeeOther(PREFIX)
    request.app[ACCESS].close_session(request, signed_out, PREFIX)
    raise signed_out


async def _static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    kind = STATIC.get(name)
    if kind is None:
        raise web.HTTPNotFound()
    return web.Response(body=_asset(name), content_type=kind, charset="utf-8")


def _refused() -> web.Response:
    return web.json_response({"error": "missing or wrong key"}, status=401)


async def _snapshot(request: web.Request) -> web.Response:
    if not request.app[ACCESS].allows(request):
        return _refused()
    return web.json_response(await request.app[BOARD].snapshot())


async def _action(request: web.Request) -> web.Response:
    if not request.app[ACCESS].allows(request):
        return _refused()
    # JSON only: a cross-site form cannot send it without a CORS preflight nobody answers.
    if request.content_type != "application/json":
        return web.json_response({"error": "send the action as JSON"}, status=415)
    try:
        asked = await request.json()
    except (ValueError, RecursionError):  # not JSON, or nested past the stack
        asked = None
    action = asked.get("action") if isinstance(asked, dict) else None
    name = asked.get("deployment") if isinstance(asked, dict) else None
    if action not in ACTIONS or not isinstance(name, str):
        return web.json_response(
            {"error": f"give a deployment and an action: {', '.join(ACTIONS)}"}, status=400
        )
    board = request.app[BOARD]
    if name in board.busy:
        return web.json_response({"error": f"{name} is busy: {board.busy[name]}"}, status=409)
    board.busy[name] = action
    try:
        await board.controls.act(action, name)
    except SM120Error as exc:
        return web.json_response({"error": exc.one_line()}, status=409)
    finally:
        del board.busy[name]
        board.forget()
    return web.json_response({"done": action, "deployment": name})
