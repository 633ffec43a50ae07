"""The gateway's HTTP side: one OpenAI-compatible endpoint on aiohttp.web, forwarding each
request to the deployment serving its `model` and copying the answer back byte for byte
(Server-Sent Events included), with the upstream's status."""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from sm120.gateway.backends import Backend
from sm120.gateway.panel import add_dashboard_for
from sm120.gateway.swap import Discover, SwapFailed, Swapper

ROUTED_PATHS = ("/v1/chat/completions", "/v1/completions")
# Long prompts are fine; a body this big is a mistake or an attack.
MAX_BODY_BYTES = 32 * 1024 * 1024
# A backend that is down refuses at once; one that is wedged must not hang the client.
CONNECT_TIMEOUT_S = 3.0
# Between two chunks of an answer: a long prefill may take minutes before the first one.
READ_TIMEOUT_S = 600.0
# Headers about the connection or the body's framing belong to each hop, not the answer.
# How long a routing table read from the state files is reused. Reading it costs every
# deployment's state, key, launch spec and a liveness check (measured: +18 ms to first token
# per request on a busy 2-core box, benchmarks/gateway_overhead.py). A model missing from the
# table or not running is always looked up afresh, so a deployment launched a moment ago is
# found at once; one that died within the second gets the 502 of a refused connection.
ROUTES_TTL_S = 1.0
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SWAPPER: web.AppKey[Swapper] = web.AppKey("swapper", Swapper)
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)


class RouteCache:
    """The model -> deployment table, reused for ROUTES_TTL_S between requests."""

    def __init__(self, swapper: Swapper, ttl_s: float = ROUTES_TTL_S) -> None:
        self._swapper = swapper
        self._ttl_s = ttl_s
        self._backends: dict[str, Backend] = {}
        self._read_at = float("-inf")
        self._read_after_swaps = 0

    async def lookup(self, model: str) -> tuple[Backend | None, dict[str, Backend]]:
        stale = time.monotonic() - self._read_at > self._ttl_s
        swapped = self._swapper.swap_events != self._read_after_swaps
        known = self._backends.get(model)
        # Only the fast path is cached: a model unknown or down is looked up afresh.
        if stale or swapped or known is None or not known.running:
            self._read_after_swaps = self._swapper.swap_events
            self._backends = await self._swapper.discover()
            self._read_at = time.monotonic()
        return self._backends.get(model), self._backends


ROUTES: web.AppKey[RouteCache] = web.AppKey("routes", RouteCache)


def openai_error(status: int, message: str, kind: str, **extra: Any) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": status, **extra}}
    return web.json_response(body, status=status)


def build_app(api_key: str, swapper: Swapper, session: aiohttp.ClientSession) -> web.Application:
    app = web.Application(middlewares=[_key_guard(api_key)], client_max_size=MAX_BODY_BYTES)
    app[SWAPPER] = swapper
    app[SESSION] = session
    app[ROUTES] = RouteCache(swapper)
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    for path in ROUTED_PATHS:
        app.router.add_post(path, _forward)
    add_dashboard_for(app, api_key, swapper)
    return app


def _key_guard(api_key: str) -> Middleware:
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1"):
            given = request.headers.get("Authorization", "").encode()
            # Constant time: how much of a guess matched must not show in the timing.
            if not hmac.compare_digest(given, expected):
                return openai_error(401, "missing or wrong API key", "authentication_error")
        return await handler(request)

    return guard


async def _health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _models(request: web.Request) -> web.Response:
    swapper = request.app[SWAPPER]
    backends = await swapper.discover()
    await swapper.observe(backends)
    data = [
        {
            "id": model,
            "object": "model",
            "owned_by": "sm120",
            "deployment": backend.deployment,
            "awake": swapper.awake(backend),
        }
        for model, backend in sorted(backends.items())
    ]
    return web.json_response({"object": "list", "data": data})


async def _forward(request: web.Request) -> web.StreamResponse:
    swapper = request.app[SWAPPER]
    body = await request.read()
    model = _model_of(body)
    backend, backends = await request.app[ROUTES].lookup(model or "")
    if backend is None:
        return _unknown_model(model, sorted(backends))
    await swapper.observe({backend.model: backend})
    try:
        await swapper.ensure_awake(backend)
    except SwapFailed as exc:
        response = openai_error(503, exc.one_line(), "service_unavailable")
        if exc.retry_after is not None:
            response.headers["Retry-After"] = str(exc.retry_after)
        return response
    swapper.used(backend)
    swapper.in_flight[backend.deployment] += 1
    try:
        return await _relay(request, body, backend, request.app[SESSION])
    finally:
        swapper.in_flight[backend.deployment] -= 1


def _model_of(body: bytes) -> str | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) else None


def _unknown_model(model: str | None, models: list[str]) -> web.Response:
    listed = ", ".join(models) or "none"
    what = f"model '{model}' is not served here" if model else "the request names no model"
    return openai_error(404, f"{what}; models: {listed}", "invalid_request_error", models=models)


async def _relay(
    request: web.Request, body: bytes, backend: Backend, session: aiohttp.ClientSession
) -> web.StreamResponse:
    headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
    # The answer is passed on as sent: no compression to undo on the way.
    headers["Accept-Encoding"] = "identity"
    if backend.api_key:
        headers["Authorization"] = f"Bearer {backend.api_key}"
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S
    )
    url = backend.base_url + request.path
    response: web.StreamResponse | None = None
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_HEADERS:
                    response.headers[name] = value
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
        if response is not None and response.prepared:
            # Half an answer is out: its status cannot change, so the stream just ends.
            raise
        message = f"deployment {backend.deployment} did not answer: {exc or type(exc).__name__}"
        return openai_error(502, message, "bad_gateway", deployment=backend.deployment)


async def discover_off_loop(find: Callable[[], dict[str, Backend]]) -> dict[str, Backend]:
    # Reading state files and /proc is blocking work: the event loop keeps streaming.
    return await asyncio.to_thread(find)


def discoverer(find: Callable[[], dict[str, Backend]]) -> Discover:
    async def discover() -> dict[str, Backend]:
        return await discover_off_loop(find)

    return discover
