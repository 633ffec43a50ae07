"""Who may see the dashboard: the holder of the gateway's key, given as a Bearer header (for
scripts) or once in the login form, which answers with a session cookie.

A session is a random token made at that login and kept in this process only: each login gets
its own, logout ends it, it expires after SESSION_TTL_S, and a new key (or a restart, which
is how the gateway takes one) ends them all. The cookie holds the token, never the key or
anything derived from it, and goes only to /dashboard on this host (HttpOnly,
SameSite=Strict: another site's page cannot make the browser send it)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

from aiohttp import web

COOKIE = "sm120_dashboard"
# A working day: a page left open overnight asks for the key again in the morning.
SESSION_TTL_S = 12 * 3600
# Logins without logouts (a script posting the form in a loop) must not grow the table: past
# this many, the oldest session is dropped.
MAX_SESSIONS = 256
_TOKEN_BYTES = 32


def _digest(token: str) -> bytes:
    # The table holds digests: a lookup by digest shows nothing of a guess's prefix in its
    # timing, and a memory dump shows no usable cookie.
    return hashlib.sha256(token.encode()).digest()


class Access:
    def __init__(
        self,
        api_key: str,
        ttl_s: float = SESSION_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        # Session digest -> the moment it stops being valid; dicts keep insertion order, so
        # the first entry is the oldest login.
        self._sessions: dict[bytes, float] = {}
        self.rekey(api_key)

    def rekey(self, api_key: str) -> None:
        """A new key: every session opened with the old one ends here."""
        self._bearer = f"Bearer {api_key}".encode()
        self._key = api_key.encode()
        self._sessions.clear()

    def allows(self, request: web.Request) -> bool:
        # Constant time: how much of a guessed key matched must not show in the timing.
        bearer = request.headers.get("Authorization", "").encode()
        return hmac.compare_digest(bearer, self._bearer) or self._session_of(request) is not None

    def is_key(self, given: str) -> bool:
        return hmac.compare_digest(given.strip().encode(), self._key)

    def open_session(self, response: web.StreamResponse, path: str) -> None:
        self._drop_expired()
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        token = secrets.token_urlsafe(_TOKEN_BYTES)
        self._sessions[_digest(token)] = self._clock() + self._ttl_s
        response.set_cookie(
            COOKIE, token, path=path, httponly=True, samesite="Strict", max_age=int(self._ttl_s)
        )

    def close_session(self, request: web.Request, response: web.StreamResponse, path: str) -> None:
        digest = self._session_of(request)
        if digest is not None:
            del self._sessions[digest]
        response.del_cookie(COOKIE, path=path)

    def sessions_open(self) -> int:
        self._drop_expired()
        return len(self._sessions)

    def _session_of(self, request: web.Request) -> bytes | None:
        token = request.cookies.get(COOKIE)
        if not token:
            return None
        digest = _digest(token)
        expires = self._sessions.get(digest)
        if expires is None:
            return None
        if self._clock() >= expires:
            del self._sessions[digest]
            return None
        return digest

    def _drop_expired(self) -> None:
        now = self._clock()
        for digest in [d for d, expires in self._sessions.items() if now >= expires]:
            del self._sessions[digest]
