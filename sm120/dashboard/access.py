"""Who may see the dashboard: the holder of the gateway's key, given as a Bearer header (for
scripts) or once in the login form, which answers with a session cookie. The cookie holds an
HMAC of the key, never the key, and goes only to /dashboard on this host (HttpOnly,
SameSite=Strict: another site's page cannot make the browser send it)."""

from __future__ import annotations

import hashlib
import hmac

from aiohttp import web

COOKIE = "sm120_dashboard"
_SESSION_LABEL = b"sm120 dashboard session"


class Access:
    def __init__(self, api_key: str) -> None:
        self._bearer = f"Bearer {api_key}".encode()
        self._key = api_key.encode()
        self._session = hmac.new(self._key, _SESSION_LABEL, hashlib.sha256).hexdigest()

    def allows(self, request: web.Request) -> bool:
        # Constant time, each: how much of a guess matched must not show in the timing.
        bearer = request.headers.get("Authorization", "").encode()
        cookie = request.cookies.get(COOKIE, "").encode()
        by_header = hmac.compare_digest(bearer, self._bearer)
        by_cookie = hmac.compare_digest(cookie, self._session.encode())
        return by_header or by_cookie

    def is_key(self, given: str) -> bool:
        return hmac.compare_digest(given.strip().encode(), self._key)

    def open_session(self, response: web.StreamResponse, path: str) -> None:
        response.set_cookie(
            COOKIE, self._session, path=path, httponly=True, samesite="Strict", max_age=None
        )

    @staticmethod
    def close_session(response: web.StreamResponse, path: str) -> None:
        response.del_cookie(COOKIE, path=path)
