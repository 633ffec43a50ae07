"""The gateway's HTTP side: one endpoint on aiohttp.web for every protocol a coding agent
speaks (OpenAI chat, completions and Responses; Anthropic Messages and count_tokens;
embeddings; tokenize), forwarding each request to the deployment serving its `model` (or the
one an alias names) and copying the answer back byte for byte, Server-Sent Events included.

Clients authenticate with `Authorization: Bearer KEY` (OpenAI SDKs, Codex, Claude Code's
ANTHROPIC_AUTH_TOKEN) or `x-api-key: KEY` (the Anthropic SDK, ANTHROPIC_API_KEY): one key.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from sm120.gateway.absorb import absorb, rewrites
from sm120.gateway.access_log import LOGGED, AccessLog, HandedOver, RequestRecord
from sm120.gateway.admission import Team, Unauthorized, refusal_body, refusal_headers
from sm120.gateway.aliases import (
    Alias,
    AliasTable,
    alias_table,
    model_by_deployment,
    served_model,
)
from sm120.gateway.backends import Backend
from sm120.gateway.keys import KeyEntry, KeyRing
from sm120.gateway.limits import Refusal
from sm120.gateway.panel import add_dashboard_for
from sm120.gateway.relay import (
    BODY_READ_TIMEOUT_S,
    RESPONSE_ID_PATHS,
    no_retry_headers,
    openai_error,
    relay,
    relay_by_id,
)
from sm120.gateway.sessions import EngineSessions, engine_sessions
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
SESSIONS: web.AppKey[EngineSessions] = web.AppKey("sessions", EngineSessions)
ALIASES: web.AppKey[AliasTable] = web.AppKey("aliases", AliasTable)
REWRITE: web.AppKey[Callable[[str, dict[str, Any]], dict[str, Any]] | None] = web.AppKey("rewrite")


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

    def cached(self, model: str, aliases: AliasTable) -> tuple[str, Backend] | None:
        """The route the table in hand gives when `route` would not read the state files for
        it (the front's fast path takes it without a task switch); None when it would."""
        if self._read_at == float("-inf") or self._swapper.swap_events != self._read_after_swaps:
            return None
        found = _routed(model, aliases, self._backends)
        if found is None or not found[1].running:
            return None
        return found

    async def lookup(self, model: str) -> tuple[Backend | None, dict[str, Backend]]:
        _, backend, backends = await self.route(model, NO_ALIASES)
        return backend, backends

    async def route(
        self, model: str, aliases: AliasTable
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


NO_ALIASES = AliasTable()


def _routed(
    model: str, aliases: AliasTable, backends: dict[str, Backend]
) -> tuple[str, Backend] | None:
    if model in backends:
        return model, backends[model]
    alias = aliases.first_match(model)
    if alias is None:
        return None
    target = served_model(alias.target, backends, _by_deployment(backends))
    return (target, backends[target]) if target is not None else None


# The route table changes when the state files are read again, not per request: each
# deployment's first model is worked out once per table (one entry: the table in use).
_BY_DEPLOYMENT: list[tuple[dict[str, Backend], dict[str, str]]] = []


def _by_deployment(backends: dict[str, Backend]) -> dict[str, str]:
    if _BY_DEPLOYMENT and _BY_DEPLOYMENT[0][0] is backends:
        return _BY_DEPLOYMENT[0][1]
    deployments = {name: backend.deployment for name, backend in backends.items()}
    found = model_by_deployment(backends, deployments)
    # Holding the table keeps its id from being reused by another while it is cached.
    _BY_DEPLOYMENT[:] = [(backends, found)]
    return found


ROUTES: web.AppKey[RouteCache] = web.AppKey("routes", RouteCache)


@dataclass
class FastPathCounts:
    """What the front (sm120.gateway.front) did: requests it answered itself, connections it
    handed to this application. /health shows them."""

    answered: int = 0
    handed_over: int = 0


FAST_PATH: web.AppKey[FastPathCounts] = web.AppKey("fast_path", FastPathCounts)
ACCESS_LOG: web.AppKey[AccessLog | None] = web.AppKey("access_log")
HANDED_OVER: web.AppKey[HandedOver] = web.AppKey("handed_over", HandedOver)


def build_app(
    api_key: str,
    swapper: Swapper,
    session: aiohttp.ClientSession | EngineSessions,
    aliases: Iterable[Alias] = (),
    rewrite: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
    access: AccessLog | None = None,
    team: Team | None = None,
) -> web.Application:
    """`rewrite(path, body)` may change a request body before it is sent on (the opt-in
    prompt normaliser); None sends bodies as they came. `access`: the access log, if any.
    `team`: the keys per person, their limits and usage (sm120.gateway.admission); None: the
    admin key alone. `session`: how engines are reached (sm120.gateway.sessions); a plain TCP
    session gets socket sessions beside it, closed with the application."""
    team = team or Team(KeyRing(api_key, None))
    middlewares = [_no_retry_marker, _key_guard(team)]
    if access is not None:
        middlewares.insert(0, _access_logged)
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[ACCESS_LOG] = access
    app[TEAM] = team
    app[HANDED_OVER] = HandedOver()
    app[SWAPPER] = swapper
    sessions = engine_sessions(session)
    app[SESSIONS] = sessions
    if sessions is not session:
        app.on_cleanup.append(lambda _app: sessions.close())
    app[ROUTES] = RouteCache(swapper)
    app[ALIASES] = alias_table(aliases)
    app[REWRITE] = rewrite
    app[FAST_PATH] = FastPathCounts()
    app[MODELS_LISTING] = ModelsListing()
    app.router.add_get("/", _index)
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


@web.middleware
async def _access_logged(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The access-log line of a request the application answers (the front logs its own)."""
    access = request.app[ACCESS_LOG]
    assert access is not None  # only installed with a log
    peer = request.transport.get_extra_info("peername") if request.transport else None
    client = request.app[HANDED_OVER].client(peer)
    record = RequestRecord(client, request.method, request.path, "app")
    request[LOGGED] = record
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        record.status = exc.status
        raise
    except BaseException:
        record.status = record.status or 500
        raise
    else:
        record.status = response.status
        # A streamed answer is out by now; a whole one is written after this returns.
        body = getattr(response, "body", None)
        whole = len(body) if isinstance(body, (bytes, bytearray)) else 0
        record.sent = response.body_length if response.prepared else whole
        return response
    finally:
        access.finish(record)


@web.middleware
async def _no_retry_marker(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own answers (a path with no route, a method it does not take, a body over
    the limit) say `x-should-retry: false` as the gateway's do (relay.NO_RETRY_STATUSES)."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(no_retry_headers(exc.status))
        raise
    if not response.prepared:
        response.headers.update(no_retry_headers(response.status))
    return response


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


# What `GET /` names: a person who opens the gateway's address finds where to go; nothing
# in it needs the key or tells more than the routes themselves would.
INDEX = {
    "service": "sm120 gateway",
    "dashboard": "/dashboard",
    "health": "/health",
    "models": "/v1/models",
}


async def _index(request: web.Request) -> web.Response:
    # A browser is sent to the dashboard; a script gets the index as JSON.
    if "text/html" in request.headers.get("Accept", ""):
        raise web.HTTPFound("/dashboard")
    return web.json_response({**INDEX, "protocols": list(protocol_paths().values())})


async def _health(request: web.Request) -> web.Response:
    counts = request.app[FAST_PATH]
    fast_path = {"answered": counts.answered, "handed_over": counts.handed_over}
    return web.json_response({"status": "ok", "fast_path": fast_path})


class ModelsListing:
    """The /v1/models body, built again only when what it shows changed: which models are
    served, by which deployment, and which are awake. With thousands of models and aliases
    a build costs tens of milliseconds on the event loop; a request that finds the same
    table pays a tuple of the table's states instead."""

    def __init__(self) -> None:
        self._key: tuple[tuple[str, str, bool], ...] | None = None
        self._body = b""

    def body(self, swapper: Swapper, backends: dict[str, Backend], aliases: AliasTable) -> bytes:
        key = tuple((m, b.deployment, swapper.awake(b)) for m, b in backends.items())
        if key != self._key:
            listing = {"object": "list", "data": _model_entries(swapper, backends, aliases)}
            self._body, self._key = json.dumps(listing).encode(), key
        return self._body


MODELS_LISTING: web.AppKey[ModelsListing] = web.AppKey("models_listing", ModelsListing)
TEAM: web.AppKey[Team] = web.AppKey("team", Team)
# Who sent a request, once the guard has let it in.
KEY_ENTRY: web.RequestKey[KeyEntry] = web.RequestKey("sm120.key", KeyEntry)


async def _models(request: web.Request) -> web.Response:
    swapper = request.app[SWAPPER]
    backends = await swapper.discover()
    await swapper.observe(backends)
    entry = _entry(request)
    if entry.models is not None:
        # A key held to some models sees those, and no aliases (built for it, not cached).
        mine = _allowed(backends, entry)
        listing = {"object": "list", "data": _model_entries(swapper, mine, alias_table(()))}
        return web.json_response(listing)
    body = request.app[MODELS_LISTING].body(swapper, backends, request.app[ALIASES])
    return web.Response(body=body, content_type="application/json")


def _model_entries(
    swapper: Swapper, backends: dict[str, Backend], aliases: AliasTable
) -> list[dict[str, Any]]:
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
    # Each alias is listed with where it sends: one lookup each, whatever their number.
    by_deployment = _by_deployment(backends)
    for alias in aliases:
        entry: dict[str, Any] = {"id": alias.name, "object": "model", "owned_by": "sm120"}
        entry["alias_of"] = alias.target
        target = (
            None if alias.name in backends else served_model(alias.target, backends, by_deployment)
        )
        if target is not None:
            entry.update(deployment=backends[target].deployment, served_model=target)
            entry["awake"] = swapper.awake(backends[target])
        data.append(entry)
    return data


def _some(names: list[str], total: int | None = None) -> str:
    total = len(names) if total is None else total
    shown = ", ".join(names[:NAMES_IN_404])
    return shown if total <= NAMES_IN_404 else f"{shown} and {total - NAMES_IN_404:,} more"


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
    logged = request.get(LOGGED)
    if logged is not None:
        logged.model = model
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
    if logged is not None:
        logged.deployment = backend.deployment
    refusal = _unserved(protocol, request.path, backend)
    if refusal is not None:
        return refusal
    rewrite = request.app[REWRITE]
    fixing = rewrites(backend.fixes, request.path, parsed)
    if served != model or rewrite is not None or fixing:
        # An alias must reach the engine under the name it serves; the body is sent anew.
        changed = {**parsed, "model": served}
        rewritten = rewrite(request.path, changed) if rewrite else changed
        if fixing:
            # The engine's own bugs this build has (sm120/data/engine_fixes.yaml).
            absorbed = absorb(rewritten, request.path, backend.fixes, backend.deployment)
            if absorbed.refusal is not None:
                return openai_error(404, absorbed.refusal, "invalid_request_error")
            rewritten = absorbed.body
        body = json.dumps(rewritten).encode()
    swapper = request.app[SWAPPER]
    await swapper.observe({backend.model: backend})
    try:
        await swapper.ensure_awake(backend)
    except SwapFailed as exc:
        access = request.app[ACCESS_LOG]
        if access is not None:
            access.event("refusal", reason=exc.one_line(), model=model,
                         deployment=backend.deployment)  # fmt: skip
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
        answer = await relay(request, body, backend, request.app[SESSIONS], protocol, ticket.tap)
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
    entry: KeyEntry, model: str, backends: dict[str, Backend], aliases: AliasTable
) -> web.Response:
    """What a key may see: its own models, and the aliases only for a key without a list."""
    visible = sorted(_allowed(backends, entry))
    return _unknown_model(model, visible, aliases if entry.models is None else alias_table(()))


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


# An unknown model's 404 names this many models and aliases; /v1/models has them all.
NAMES_IN_404 = 20


def _unknown_model(model: str, models: list[str], aliases: AliasTable) -> web.Response:
    listed = _some(models) or "none"
    names = [alias.name for alias in list(aliases)[: NAMES_IN_404 + 1]]
    extra = f"; aliases: {_some(names, len(aliases))}" if names else ""
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
    return await relay_by_id(request, backends, request.app[SESSIONS])


async def discover_off_loop(find: Callable[[], dict[str, Backend]]) -> dict[str, Backend]:
    # Reading state files and /proc is blocking work: the event loop keeps streaming.
    return await asyncio.to_thread(find)


def discoverer(find: Callable[[], dict[str, Backend]]) -> Discover:
    async def discover() -> dict[str, Backend]:
        return await discover_off_loop(find)

    return discover
