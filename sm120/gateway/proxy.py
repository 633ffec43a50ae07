"""The gateway's HTTP side: one endpoint on aiohttp.web for every protocol a coding agent
speaks (OpenAI chat, completions and Responses; Anthropic Messages and count_tokens;
embeddings; tokenize), forwarding each request to the deployment serving its `model` (or the
one an alias names) and copying the answer back byte for byte, Server-Sent Events included.

Clients authenticate with `Authorization: Bearer KEY` (OpenAI SDKs, Codex, Claude Code's
ANTHROPIC_AUTH_TOKEN) or `x-api-key: KEY` (the Anthropic SDK, ANTHROPIC_API_KEY): one
credential, the gateway's own (admin) key or a person's (sm120.gateway.admission).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from sm120.gateway.admission import Team, Unauthorized, refusal_body, refusal_headers
from sm120.gateway.aliases import Alias, as_table, resolve
from sm120.gateway.backends import Backend
from sm120.gateway.keys import KeyEntry, KeyRing
from sm120.gateway.limits import Refusal
from sm120.gateway.panel import add_dashboard_for
from sm120.gateway.relay import (
    BODY_READ_TIMEOUT_S,
    RESPONSE_ID_PATHS,
    openai_error,
    relay,
    relay_by_id,
)
from sm120.gateway.swap import Discover, SwapFailed, Swapper
from sm120.recipe.endpoints import protocol_for_path, protocol_paths

# Long prompts are fine; a body this big is a mistake or an attack.
MAX_BODY_BYTES = 32 * 1024 * 1024
# How long a routing table read from the state files is reused. Reading it costs every
# deployment's state, key, launch spec and a liveness check (measured: +18 ms to first token
# per request on a busy 2-core box, benchmarks/gateway_overhead.py). A model missing from the
# table or not running is always looked up afresh, so a deployment launched a moment ago is
# found at once; one that died within the second gets the 502 of a refused connection.
ROUTES_TTL_S = 1.0
# A connection that has not sent a whole request head this long after it opened, or after
# its last answer, is closed: idle keep-alive sockets and slow-header clients cannot pile up.
IDLE_CONNECTION_S = 30.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SWAPPER: web.AppKey[Swapper] = web.AppKey("swapper", Swapper)
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)
ALIASES: web.AppKey[tuple[Alias, ...]] = web.AppKey("aliases")
REWRITE: web.AppKey[Callable[[str, dict[str, Any]], dict[str, Any]] | None] = web.AppKey("rewrite")
TEAM: web.AppKey[Team] = web.AppKey("team", Team)
# Who sent a request, once the guard has let it in.
KEY_ENTRY: web.RequestKey[KeyEntry] = web.RequestKey("sm120.key", KeyEntry)


class RouteCache:
    """The model -> deployment table. A request never waits for a read of the state files
    when the table names its model as running: a table older than ROUTES_TTL_S is served as
    it is, and renewed in the background once that request is answered. A model unknown or
    down, or any model after a swap, waits for a fresh read. Concurrent requests share one
    read in flight (64 streams opening at once cost one read, not 64: GPU run 1, aggregate
    0.962 before)."""

    def __init__(self, swapper: Swapper, ttl_s: float = ROUTES_TTL_S) -> None:
        self._swapper = swapper
        self._ttl_s = ttl_s
        self._backends: dict[str, Backend] = {}
        self._read_at = float("-inf")
        self._read_after_swaps = 0
        self._reading: asyncio.Task[dict[str, Backend]] | None = None

    async def table(self, fresh: bool = False) -> dict[str, Backend]:
        return (await self._read(fresh))[0]

    async def _read(self, fresh: bool) -> tuple[dict[str, Backend], bool]:
        """The table, and whether it was read from the state files for this call."""
        swapped = self._swapper.swap_events != self._read_after_swaps
        if fresh or swapped or self._read_at == float("-inf"):
            return await self._shared_read(), True
        return self._backends, False

    def renew_if_stale(self) -> None:
        """Start a background read when the table is older than its TTL. Called once a
        request's answer is out, not before: the read holds the GIL in its thread, and a read
        beside a starting request cost that request's first token (GPU run 2: TTFT 1.048)."""
        stale = time.monotonic() - self._read_at > self._ttl_s
        if stale and self._reading is None:
            self._reading = asyncio.ensure_future(self._read_files())

    async def _shared_read(self) -> dict[str, Backend]:
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read_files())
        # Shielded: one caller giving up must not cancel the read the others wait on.
        return await asyncio.shield(self._reading)

    async def _read_files(self) -> dict[str, Backend]:
        swaps = self._swapper.swap_events
        try:
            backends = await self._swapper.discover()
        finally:
            self._reading = None
        self._backends = backends
        self._read_at = time.monotonic()
        self._read_after_swaps = swaps
        return backends

    def cached(self, model: str, aliases: tuple[Alias, ...]) -> tuple[str, Backend] | None:
        """The route the table in hand gives when `route` would not read the state files for
        it (the front's fast path takes it without a task switch); None when it would."""
        if self._read_at == float("-inf") or self._swapper.swap_events != self._read_after_swaps:
            return None
        found = _routed(model, aliases, self._backends)
        if found is None or not found[1].running:
            return None
        return found

    async def lookup(self, model: str) -> tuple[Backend | None, dict[str, Backend]]:
        _, backend, backends = await self.route(model, ())
        return backend, backends

    async def route(
        self, model: str, aliases: tuple[Alias, ...]
    ) -> tuple[str, Backend | None, dict[str, Backend]]:
        """The served model `model` reaches (itself, or an alias's target) and its backend.
        Only the fast path is cached: a model unknown or down is looked up afresh."""
        backends, just_read = await self._read(False)
        found = _routed(model, aliases, backends)
        if (found is None or not found[1].running) and not just_read:
            backends, _ = await self._read(True)
            found = _routed(model, aliases, backends)
        if found is None:
            return model, None, backends
        return found[0], found[1], backends


def _routed(
    model: str, aliases: tuple[Alias, ...], backends: dict[str, Backend]
) -> tuple[str, Backend] | None:
    if model in backends:
        return model, backends[model]
    deployments = {name: backend.deployment for name, backend in backends.items()}
    return resolve(model, aliases, backends, deployments)


ROUTES: web.AppKey[RouteCache] = web.AppKey("routes", RouteCache)


@dataclass
class FastPathCounts:
    """What the front (sm120.gateway.front) did: requests it answered itself, connections it
    handed to this application. /health shows them."""

    answered: int = 0
    handed_over: int = 0


FAST_PATH: web.AppKey[FastPathCounts] = web.AppKey("fast_path", FastPathCounts)


def build_app(
    api_key: str,
    swapper: Swapper,
    session: aiohttp.ClientSession,
    aliases: tuple[Alias, ...] = (),
    rewrite: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
    team: Team | None = None,
) -> web.Application:
    """`rewrite(path, body)` may change a request body before it is sent on (the opt-in
    prompt normaliser); None sends bodies as they came. `team`: the keys per person, their
    limits and usage (sm120.gateway.admission); None: the admin key alone."""
    team = team or Team(KeyRing(api_key, None))
    app = web.Application(middlewares=[_key_guard(team)], client_max_size=MAX_BODY_BYTES)
    app[TEAM] = team
    app[SWAPPER] = swapper
    app[SESSION] = session
    app[ROUTES] = RouteCache(swapper)
    app[ALIASES] = aliases
    app[REWRITE] = rewrite
    app[FAST_PATH] = FastPathCounts()
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    for path in protocol_paths().values():
        app.router.add_post(path, _forward)
    for method, path in RESPONSE_ID_PATHS:
        app.router.add_route(method, path, _by_response_id)
    add_dashboard_for(app, api_key, swapper)
    return app


def guarded(path: str) -> bool:
    """Everything a client can ask of a model needs a key, and /metrics the admin key; only
    /health does not."""
    return (
        path.startswith("/v1/")
        or path == "/v1"
        or path == "/metrics"
        or protocol_for_path(path) is not None
    )


def _key_guard(team: Team) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not guarded(request.path):
            return await handler(request)
        # Every header as sent, repeats included: two credentials are refused, not picked from.
        who = team.identify(request.headers.items())
        if isinstance(who, Unauthorized):
            return openai_error(401, who.message, "authentication_error")
        if request.path == "/metrics" and not who.admin:
            return openai_error(403, "/metrics takes the admin key", "permission_error")
        request[KEY_ENTRY] = who
        return await handler(request)

    return guard


def _entry(request: web.Request) -> KeyEntry:
    return request[KEY_ENTRY]


async def _metrics(request: web.Request) -> web.Response:
    text = request.app[TEAM].meter.render()
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def _health(request: web.Request) -> web.Response:
    counts = request.app[FAST_PATH]
    fast_path = {"answered": counts.answered, "handed_over": counts.handed_over}
    return web.json_response({"status": "ok", "fast_path": fast_path})


async def _models(request: web.Request) -> web.Response:
    swapper = request.app[SWAPPER]
    backends = _allowed(await swapper.discover(), _entry(request))
    await swapper.observe(backends)
    data: list[dict[str, Any]] = [
        {
            "id": model,
            "object": "model",
            "owned_by": "sm120",
            "deployment": backend.deployment,
            "awake": swapper.awake(backend),
        }
        for model, backend in sorted(backends.items())
    ]
    aliases: tuple[Alias, ...] = request.app[ALIASES] if _entry(request).models is None else ()
    for name, target in as_table(aliases).items():
        found = _routed(name, aliases, backends) if name not in backends else None
        entry: dict[str, Any] = {"id": name, "object": "model", "owned_by": "sm120"}
        entry["alias_of"] = target
        if found is not None:
            entry.update(deployment=found[1].deployment, served_model=found[0])
            entry["awake"] = swapper.awake(found[1])
        data.append(entry)
    return web.json_response({"object": "list", "data": data})


async def _forward(request: web.Request) -> web.StreamResponse:
    protocol = protocol_for_path(request.path) or request.path
    body = await _read_body(request)
    if isinstance(body, web.Response):
        return body
    parsed = _json_object(body)
    if isinstance(parsed, web.Response):
        return parsed
    model = parsed.get("model")
    if model is not None and not isinstance(model, str):
        return openai_error(400, "'model' must be a string", "invalid_request_error")
    routes = request.app[ROUTES]
    if not model:
        # Engines take a request without a model as one for the model they serve: so does
        # the gateway when it has exactly one; with several, it cannot guess.
        table = await routes.table(fresh=True)
        if len(table) != 1:
            return _no_model(sorted(table))
        model = next(iter(table))
    entry = _entry(request)
    served, backend, backends = await routes.route(model, request.app[ALIASES])
    if backend is None or not entry.allows(served):
        # A model the key may not use is answered as one that is not here: the same 404.
        # Recorded under the served name, or "(unknown)": a client's made-up names must not
        # grow the usage tables and the metrics' label sets without bound.
        named = served if backend is not None else "(unknown)"
        request.app[TEAM].refusal_recorded(entry, named, protocol, 404)
        return _unknown_model_for(entry, model, backends, request.app[ALIASES])
    refusal = _unserved(protocol, request.path, backend)
    if refusal is not None:
        return refusal
    rewrite = request.app[REWRITE]
    if served != model or rewrite is not None:
        # An alias must reach the engine under the name it serves; the body is sent anew.
        changed = {**parsed, "model": served}
        body = json.dumps(rewrite(request.path, changed) if rewrite else changed).encode()
    swapper = request.app[SWAPPER]
    await swapper.observe({backend.model: backend})
    try:
        await swapper.ensure_awake(backend)
    except SwapFailed as exc:
        response = openai_error(503, exc.one_line(), "service_unavailable")
        if exc.retry_after is not None:
            response.headers["Retry-After"] = str(exc.retry_after)
        return response
    team = request.app[TEAM]
    ticket = team.admit(entry, backend.deployment, backend.max_num_seqs, served, protocol, parsed)
    if isinstance(ticket, Refusal):
        return _refused(team, protocol, ticket, entry, served)
    if not team.take_turn(ticket):
        no_turn = await team.wait_turn(ticket)
        if no_turn is not None:
            return _refused(team, protocol, no_turn, entry, served)
    swapper.used(backend)
    swapper.in_flight[backend.deployment] += 1
    answer: web.StreamResponse | None = None
    try:
        answer = await relay(request, body, backend, request.app[SESSION], protocol, ticket.tap)
        return answer
    finally:
        swapper.in_flight[backend.deployment] -= 1
        # A client gone before the answer's head is 499, as nginx logs it.
        team.finish(ticket, answer.status if answer is not None else ticket.tap.status or 499)
        routes.renew_if_stale()


def _refused(
    team: Team, protocol: str, refusal: Refusal, entry: KeyEntry, model: str
) -> web.Response:
    team.refusal_recorded(entry, model, protocol, 429)
    return web.Response(
        status=429, body=refusal_body(protocol, refusal, entry.name),
        headers=refusal_headers(refusal), content_type="application/json", charset="utf-8",
    )  # fmt: skip


def _allowed(backends: dict[str, Backend], entry: KeyEntry) -> dict[str, Backend]:
    if entry.models is None:
        return backends
    return {model: b for model, b in backends.items() if entry.allows(model)}


def _unknown_model_for(
    entry: KeyEntry, model: str, backends: dict[str, Backend], aliases: tuple[Alias, ...]
) -> web.Response:
    """What a key may see: its own models, and the aliases only for a key without a list."""
    visible = sorted(_allowed(backends, entry))
    return _unknown_model(model, visible, aliases if entry.models is None else ())


async def _read_body(request: web.Request) -> bytes | web.Response:
    try:
        body: bytes = await asyncio.wait_for(request.read(), BODY_READ_TIMEOUT_S)
        return body
    except web.HTTPRequestEntityTooLarge:
        return openai_error(
            413,
            f"request body is larger than {MAX_BODY_BYTES // (1 << 20)} MiB",
            "invalid_request_error",
        )
    except asyncio.TimeoutError:
        return openai_error(
            408, f"request body not received within {BODY_READ_TIMEOUT_S:.0f} s", "timeout"
        )


def _json_object(body: bytes) -> dict[str, Any] | web.Response:
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return openai_error(400, "the request body is not valid JSON", "invalid_request_error")
    if not isinstance(parsed, dict):
        return openai_error(400, "the request body is not a JSON object", "invalid_request_error")
    return parsed


def _no_model(models: list[str]) -> web.Response:
    listed = ", ".join(models) or "none"
    return openai_error(
        400, f"the request names no model; models: {listed}", "invalid_request_error",
        models=models,
    )  # fmt: skip


def _unknown_model(model: str, models: list[str], aliases: tuple[Alias, ...]) -> web.Response:
    listed = ", ".join(models) or "none"
    names = [alias.name for alias in aliases]
    extra = f"; aliases: {', '.join(names)}" if names else ""
    return openai_error(
        404,
        f"model '{model}' is not served here; models: {listed}{extra}",
        "invalid_request_error",
        models=models,
    )


def _unserved(protocol: str, path: str, backend: Backend) -> web.Response | None:
    engine = backend.protocols
    if engine is None or not engine.known_not_to_serve(protocol):
        return None
    serves = ", ".join(sorted(protocol_paths()[name] for name in engine.serves)) or "none known"
    return openai_error(
        501,
        f"deployment {backend.deployment} runs {engine.label}, which does not serve {path}; "
        f"it serves {serves}",
        "not_implemented",
        deployment=backend.deployment,
    )


async def _by_response_id(request: web.Request) -> web.StreamResponse:
    """A stored response is asked for by id alone: the deployments that may hold it are
    asked in turn, and the first that knows it answers."""
    routes = request.app[ROUTES]
    backends = [b for b in (await routes.table(fresh=True)).values() if b.running]
    return await relay_by_id(request, backends, request.app[SESSION])


async def discover_off_loop(find: Callable[[], dict[str, Backend]]) -> dict[str, Backend]:
    # Reading state files and /proc is blocking work: the event loop keeps streaming.
    return await asyncio.to_thread(find)


def discoverer(find: Callable[[], dict[str, Backend]]) -> Discover:
    async def discover() -> dict[str, Backend]:
        return await discover_off_loop(find)

    return discover
