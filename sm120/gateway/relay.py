"""Sending one request on to a deployment and its answer back: headers that belong to each hop
dropped, the answer's bytes passed on as they arrive (an event stream chunk by chunk), and the
engine's route-miss 404 turned into an error that names the engine."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import aiohttp
from aiohttp import web

from sm120.gateway.absorb import EXPLAIN_RESPONSE_STORE, no_store_message
from sm120.gateway.access_log import LOGGED
from sm120.gateway.backends import Backend
from sm120.gateway.sessions import EngineSessions
from sm120.gateway.usage import Tap

# A backend that is down refuses at once; one that is wedged must not hang the client.
CONNECT_TIMEOUT_S = 3.0
# Between two chunks of an answer: a long prefill may take minutes before the first one.
READ_TIMEOUT_S = 600.0
# A client that starts a body must finish sending it.
BODY_READ_TIMEOUT_S = 60.0
# Headers about the connection or the body's framing belong to each hop, not the answer.
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}
)
# Headers a client sends that the engine may read (Anthropic's version and beta flags); the
# key is never passed on: each deployment gets its own.
PASSED_REQUEST_HEADERS = ("Content-Type", "anthropic-version", "anthropic-beta", "Accept")
# A route-miss answer is small; anything bigger is the engine's own answer, passed on.
ROUTE_MISS_BYTES = 4096
# Stored responses of the Responses API, asked for by id with no model to route by.
RESPONSE_ID_PATHS = (
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("POST", "/v1/responses/{response_id}/cancel"),
)
# Answers a retry cannot change: a malformed body, a missing or wrong key, a forbidden one, an
# unknown model or path, a body too large, a protocol the engine lacks. They carry
# `x-should-retry: false`, which the Anthropic SDK and Claude Code honour over their own rules
# (Claude Code otherwise retries a 401 for minutes). 408, 409, 429 and the 5xx but 501 stay
# retryable: a swap, a slow engine or a restart may be over by the next try. Codex reads no
# such header: it retries only 429, 5xx and transport errors (openai/codex
# codex-rs/codex-client/src/retry.rs), so these 4xx already end it; a 501 costs it its
# request_max_retries.
NO_RETRY_STATUSES = frozenset({400, 401, 403, 404, 405, 413, 415, 422, 501})
NO_RETRY = "x-should-retry"
_TIMEOUT = aiohttp.ClientTimeout(
    total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S
)


def _error_body(status: int, message: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status, **extra}}


def no_retry_headers(status: int) -> dict[str, str]:
    """The header that tells a client not to retry an answer with this status, if it needs one."""
    return {NO_RETRY: "false"} if status in NO_RETRY_STATUSES else {}


def openai_error(status: int, message: str, kind: str, **extra: Any) -> web.Response:
    """An error in the OpenAI shape every client SDK parses (the gateway's own answers)."""
    body = _error_body(status, message, kind, **extra)
    return web.json_response(body, status=status, headers=no_retry_headers(status))


def error_bytes(
    status: int, message: str, kind: str, *, close: bool = False, **extra: Any
) -> bytes:
    """The same error as `openai_error`, as a whole HTTP/1.1 answer for the gateway's fast
    path (sm120.gateway.front), which writes bytes, not aiohttp responses. `close`: the
    connection ends after it, and the answer says so."""
    body = json.dumps(_error_body(status, message, kind, **extra)).encode()
    marker = "".join(f"{name}: {value}\r\n" for name, value in no_retry_headers(status).items())
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n{marker}"
        f"Content-Type: application/json; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        + ("Connection: close\r\n" if close else "")
        + "\r\n"
    )
    return head.encode() + body


def engine_headers(sent: Callable[[str], str | None], backend: Backend) -> dict[str, str]:
    """The headers a deployment gets, from `sent` (a client's header by name): the client's
    protocol headers, the deployment's own key (never the gateway's), no compression."""
    headers = {}
    for name in PASSED_REQUEST_HEADERS:
        value = sent(name)
        if value is not None:
            headers[name] = value
    headers.setdefault("Content-Type", "application/json")
    # The answer is passed on as sent: no compression to undo on the way.
    headers["Accept-Encoding"] = "identity"
    if backend.api_key:
        headers["Authorization"] = f"Bearer {backend.api_key}"
    return headers


def _upstream_headers(request: web.Request, backend: Backend) -> dict[str, str]:
    return engine_headers(request.headers.get, backend)


async def relay(
    request: web.Request,
    body: bytes,
    backend: Backend,
    sessions: EngineSessions,
    protocol: str,
    tap: Tap | None = None,
) -> web.StreamResponse:
    """`tap` sees the answer's bytes go by (for the usage record)."""
    url = backend.base_url + request.path_qs
    response: web.StreamResponse | None = None
    try:
        async with sessions.for_backend(backend).request(
            request.method, url, data=body, headers=_upstream_headers(request, backend),
            timeout=_TIMEOUT,
        ) as upstream:  # fmt: skip
            if upstream.status == 404:
                miss = await _route_miss(upstream, backend, request.path, protocol)
                if miss is not None:
                    return miss
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_HEADERS:
                    response.headers[name] = value
            # The engine's own 400 (a prompt too long, a bad tool schema) is as final as ours.
            response.headers.update(no_retry_headers(upstream.status))
            await response.prepare(request)
            if tap is not None:
                tap.status = upstream.status
            logged = request.get(LOGGED)
            if logged is not None and logged.first_byte is None:
                logged.first_byte = time.monotonic()
            async for chunk in upstream.content.iter_any():
                if tap is not None:
                    tap.seen(chunk)
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
        if response is not None and response.prepared:
            # Half an answer is out: its status cannot change, so the stream just ends.
            raise
        message = f"deployment {backend.deployment} did not answer: {exc or type(exc).__name__}"
        return openai_error(502, message, "bad_gateway", deployment=backend.deployment)


async def _route_miss(
    upstream: aiohttp.ClientResponse, backend: Backend, path: str, protocol: str
) -> web.Response | None:
    """The engine's web framework answering 404 for a path it has no route for (FastAPI's
    `{"detail": "Not Found"}`) becomes a 501 that says which engine lacks which protocol; a
    404 of the engine's own (an unknown model, a response id it does not hold) is passed on."""
    raw = await upstream.content.read(ROUTE_MISS_BYTES + 1)
    if not is_route_miss(raw):
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
        headers.update(no_retry_headers(404))
        rest = await upstream.content.read()
        return web.Response(status=404, body=raw + rest, headers=headers)
    return openai_error(501, route_miss_message(backend, path, protocol), "not_implemented",
                        deployment=backend.deployment)  # fmt: skip


def is_route_miss(body: bytes) -> bool:
    """FastAPI's answer for a path it has no route for, told from an engine's own 404."""
    if len(body) > ROUTE_MISS_BYTES:
        return False
    try:
        return bool(json.loads(body) == {"detail": "Not Found"})
    except ValueError:
        return False


def route_miss_message(backend: Backend, path: str, protocol: str) -> str:
    engine = backend.protocols.label if backend.protocols else "its engine"
    return (
        f"deployment {backend.deployment} ({engine}) does not serve {path} "
        f"({protocol}): the engine has no such route"
    )


async def relay_by_id(
    request: web.Request, backends: list[Backend], sessions: EngineSessions
) -> web.StreamResponse:
    """Ask each running deployment for a stored response until one knows it."""
    body = await request.read()
    for backend in backends:
        if backend.protocols is not None and backend.protocols.known_not_to_serve("responses"):
            continue
        url = backend.base_url + request.path_qs
        try:
            async with sessions.for_backend(backend).request(
                request.method, url, data=body or None,
                headers=_upstream_headers(request, backend), timeout=_TIMEOUT,
            ) as upstream:  # fmt: skip
                if upstream.status == 404:
                    continue
                headers = {
                    k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS
                }
                headers.update(no_retry_headers(upstream.status))
                return web.Response(
                    status=upstream.status, body=await upstream.read(), headers=headers
                )
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
            continue
    response_id = request.match_info["response_id"]
    message = f"no running deployment holds response {response_id}"
    forgetful = [b.deployment for b in backends if EXPLAIN_RESPONSE_STORE in b.fixes]
    if forgetful:
        # The engines that keep none say only "not found": say why, and what works.
        message += "; " + no_store_message(", ".join(sorted(forgetful)), response_id)
    return openai_error(404, message, "invalid_request_error")
