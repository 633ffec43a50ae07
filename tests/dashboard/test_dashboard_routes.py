"""The dashboard's routes inside the gateway's app, in front of scripted backends: the key
guards every page and data route, static files carry their types and a strict CSP, and the
buttons reach the gateway's actions. The real browser and engine are in
tests/integration/test_dashboard_realstack.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from sm120.dashboard.access import COOKIE
from sm120.dashboard.routes import CSP
from sm120.gateway.panel import SwapperControls
from sm120.gateway.swap import SwapPolicy
from tests.fakes.gateway import GATEWAY_KEY, FakeActions, backend, running_gateway

ENGINE = "http://127.0.0.1:9"


def _table() -> dict[str, Any]:
    return {"m": backend("m", ENGINE, sleep_mode=True)}


def _ask(
    method: str, path: str, *, key: bool = True, actions: FakeActions | None = None, **request: Any
) -> tuple[int, dict[str, str], str]:
    table = _table()
    actions = actions or FakeActions(table)

    async def scenario() -> tuple[int, dict[str, str], str]:
        async with running_gateway(table, SwapPolicy(), actions) as (client, _):
            headers = request.pop("headers", None) or (None if key else {"Authorization": ""})
            async with client.request(
                method, path, headers=headers, allow_redirects=False, **request
            ) as answer:
                return answer.status, dict(answer.headers), await answer.text()

    return asyncio.run(scenario())


def test_the_page_without_the_key_is_only_the_login_prompt() -> None:
    status, headers, body = _ask("GET", "/dashboard", key=False)
    assert status == 401
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Content-Security-Policy"] == CSP
    assert 'name="key"' in body and 'type="password"' in body
    # No script and no data: nothing but the form.
    assert "<script" not in body and "/api/" not in body


def test_the_page_with_the_key_loads_the_vendored_scripts() -> None:
    status, headers, body = _ask("GET", "/dashboard")
    assert status == 200
    assert headers["Cache-Control"] == "no-store"
    assert '<script src="/dashboard/static/uPlot.iife.min.js"' in body
    # The policy allows no inline code, so the page has none.
    assert "<script>" not in body and " style=" not in body


def test_static_files_carry_their_content_types_and_nothing_else_is_served() -> None:
    for name, kind in (
        ("dashboard.js", "text/javascript"),
        ("uPlot.min.css", "text/css"),
        ("uPlot.LICENSE", "text/plain"),
    ):
        status, headers, body = _ask("GET", f"/dashboard/static/{name}", key=False)
        assert (status, headers["Content-Type"]) == (200, f"{kind}; charset=utf-8"), name
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert body
    assert _ask("GET", "/dashboard/static/index.html")[0] == 404
    assert _ask("GET", "/dashboard/static/..%2Froutes.py")[0] == 404


def test_the_data_routes_refuse_a_missing_or_wrong_key() -> None:
    assert _ask("GET", "/dashboard/api/snapshot", key=False)[0] == 401
    status, _, body = _ask(
        "GET", "/dashboard/api/snapshot", key=False, headers={"Authorization": "Bearer nope"}
    )
    assert (status, json.loads(body)) == (401, {"error": "missing or wrong key"})
    assert _ask("POST", "/dashboard/api/actions", key=False, json={})[0] == 401


def test_a_snapshot_with_the_key_lists_the_deployments() -> None:
    status, _, body = _ask("GET", "/dashboard/api/snapshot")
    assert status == 200
    data = json.loads(body)
    assert data["deployments"] == [] and data["gpus"] == []
    assert data["gateway"] is None


def test_login_sets_a_session_cookie_that_is_not_the_key() -> None:
    table = _table()

    async def scenario() -> tuple[int, int, int, str]:
        async with running_gateway(table, SwapPolicy(), FakeActions(table)) as (client, _):
            client.headers.pop("Authorization")
            async with client.post(
                "/dashboard/login", data={"key": "wrong"}, allow_redirects=False
            ) as wrong:
                refused, page = wrong.status, await wrong.text()
            assert "is not the gateway key" in page
            async with client.post(
                "/dashboard/login", data={"key": GATEWAY_KEY}, allow_redirects=False
            ) as right:
                signed_in = right.status
                cookie = right.cookies[COOKIE]
            # The test client keeps no cookies for an IP address: send it as a browser would.
            session = {"Cookie": f"{COOKIE}={cookie.value}"}
            async with client.get("/dashboard/api/snapshot", headers=session) as snapshot:
                return refused, signed_in, snapshot.status, cookie.value + str(cookie)

    refused, signed_in, snapshot, cookie = asyncio.run(scenario())
    assert (refused, signed_in, snapshot) == (401, 303, 200)
    assert GATEWAY_KEY not in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/dashboard" in cookie


def test_sleep_and_wake_go_through_the_gateways_actions() -> None:
    table = {**_table(), "n": backend("n", ENGINE)}
    actions = FakeActions(table)

    async def scenario() -> tuple[list[int], set[str], dict[str, bool]]:
        async with running_gateway(table, SwapPolicy(), actions) as (client, swapper):
            statuses = []
            for action in ("sleep", "wake", "sleep"):
                body = {"action": action, "deployment": "dep-m"}
                async with client.post("/dashboard/api/actions", json=body) as answer:
                    statuses.append(answer.status)
            # Only the sleep-mode deployment is offered sleep and wake.
            sleepers = await SwapperControls(swapper).sleepers()
            return statuses, set(swapper.asleep), sleepers

    statuses, asleep, sleepers = asyncio.run(scenario())
    assert statuses == [200, 200, 200]
    assert actions.done == ["sleep dep-m", "wake dep-m", "sleep dep-m"]
    assert asleep == {"dep-m"}
    assert sleepers == {"dep-m": True}


def test_relaunch_stops_then_starts() -> None:
    actions = FakeActions(_table())
    assert _ask(
        "POST", "/dashboard/api/actions", actions=actions, json={"action": "relaunch",
        "deployment": "dep-m"},
    )[0] == 200  # fmt: skip
    assert actions.done == ["stop dep-m", "start dep-m"]


def test_a_bad_action_request_says_what_is_wanted() -> None:
    status, _, body = _ask(
        "POST", "/dashboard/api/actions", json={"action": "explode", "deployment": "dep-m"}
    )
    assert (status, json.loads(body)["error"]) == (
        400,
        "give a deployment and an action: wake, sleep, stop, relaunch",
    )
    status, _, body = _ask(
        "POST", "/dashboard/api/actions", json={"action": "stop", "deployment": "ghost"}
    )
    assert status == 409
    assert json.loads(body)["error"] == (
        "no deployment named 'ghost' serves or can serve again (hint: see 'sm120 status')"
    )


def test_an_action_must_come_as_json() -> None:
    status, _, _ = _ask("POST", "/dashboard/api/actions", data=aiohttp.FormData({"action": "stop"}))
    assert status == 415


def _login(client: Any) -> str:
    """Log in through the form; the session cookie's value."""

    async def go() -> str:
        async with client.post(
            "/dashboard/login", data={"key": GATEWAY_KEY}, allow_redirects=False
        ) as right:
            assert right.status == 303
            return str(right.cookies[COOKIE].value)

    return go()  # type: ignore[return-value]


def test_each_login_gets_its_own_session_and_logout_ends_it() -> None:
    table = _table()

    async def scenario() -> tuple[bool, list[int]]:
        async with running_gateway(table, SwapPolicy(), FakeActions(table)) as (client, _):
            client.headers.pop("Authorization")
            first, second = await _login(client), await _login(client)

            async def snapshot_with(cookie: str) -> int:
                headers = {"Cookie": f"{COOKIE}={cookie}"}
                async with client.get("/dashboard/api/snapshot", headers=headers) as answer:
                    return answer.status

            before = [await snapshot_with(first), await snapshot_with(second)]
            headers = {"Cookie": f"{COOKIE}={first}"}
            async with client.post(
                "/dashboard/logout", headers=headers, allow_redirects=False
            ) as out:
                assert out.status == 303
            after = [await snapshot_with(first), await snapshot_with(second)]
            forged = await snapshot_with("A" * 43)
            return first != second, before + after + [forged]

    distinct, statuses = asyncio.run(scenario())
    assert distinct
    # The logged-out cookie is refused; the other login's session carries on.
    assert statuses == [200, 200, 401, 200, 401]


def test_a_session_expires_and_a_new_key_ends_every_session() -> None:
    from aiohttp.test_utils import make_mocked_request
    from aiohttp.web import Response

    from sm120.dashboard.access import Access

    clock = [0.0]
    access = Access("k1", ttl_s=60.0, clock=lambda: clock[0])

    def opened() -> str:
        response = Response()
        access.open_session(response, "/dashboard")
        morsel = response.cookies[COOKIE]
        assert morsel["max-age"] == "60"
        return str(morsel.value)

    def allowed(cookie: str) -> bool:
        request = make_mocked_request("GET", "/dashboard", headers={"Cookie": f"{COOKIE}={cookie}"})
        return access.allows(request)

    early = opened()
    clock[0] = 59.0
    assert allowed(early)
    clock[0] = 60.0
    assert not allowed(early)
    late = opened()
    assert allowed(late)
    access.rekey("k2")
    assert not allowed(late) and access.sessions_open() == 0


def test_logins_without_logouts_do_not_grow_the_session_table() -> None:
    from aiohttp.web import Response

    from sm120.dashboard.access import MAX_SESSIONS, Access

    access = Access("k")
    for _ in range(MAX_SESSIONS + 50):
        access.open_session(Response(), "/dashboard")
    assert access.sessions_open() == MAX_SESSIONS


def test_a_deeply_nested_action_body_is_a_400() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    status, _, body = _ask(
        "POST",
        "/dashboard/api/actions",
        data=deep,
        headers={"Authorization": f"Bearer {GATEWAY_KEY}", "Content-Type": "application/json"},
    )
    assert (status, json.loads(body)["error"]) == (
        400,
        "give a deployment and an action: wake, sleep, stop, relaunch",
    )


def test_relaunch_without_a_launch_record_refuses_before_stopping() -> None:
    table = {"m": backend("m", ENGINE, startable=False)}
    actions = FakeActions(table)

    async def scenario() -> tuple[int, str]:
        async with running_gateway(table, SwapPolicy(), actions) as (client, _):
            body = {"action": "relaunch", "deployment": "dep-m"}
            async with client.post("/dashboard/api/actions", json=body) as answer:
                return answer.status, (await answer.json())["error"]

    assert asyncio.run(scenario()) == (
        409,
        "'dep-m' kept no usable launch record, so it cannot be started again from here; "
        "nothing was stopped (hint: relaunch it with 'sm120 launch <recipe> --name dep-m')",
    )
    assert actions.done == []


def test_the_usage_view_needs_the_key_and_reads_the_gateways_usage(
    isolated_home: Any,
) -> None:
    from sm120.gateway.files import gateway_files
    from sm120.gateway.usage import Record, connect, insert

    db = connect(gateway_files().usage_db, create=True)
    insert(db, [Record("ann<script>", "m", "chat", 200, 0.0, prompt_tokens=7, ttft_ms=12.0)])
    db.close()
    assert _ask("GET", "/dashboard/api/usage", key=False)[0] == 401
    status, _, body = _ask("GET", "/dashboard/api/usage")
    data = json.loads(body)
    assert status == 200
    # Data, never markup: the page puts each value in as text (static/usage.js).
    assert [(r["key"], r["requests"], r["prompt_tokens"]) for r in data["by_key"]] == [
        ("ann<script>", 1, 7)
    ]
    assert [(r["key"], r["status"], r["ttft_ms"]) for r in data["recent"]] == [
        ("ann<script>", 200, 12.0)
    ]
    script = _ask("GET", "/dashboard/static/usage.js", key=False)[2]
    assert "textContent" in script and "innerHTML" not in script
