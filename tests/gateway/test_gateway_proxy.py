"""Routing, keys, errors and swaps of the gateway against scripted backends."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from sm120.gateway.backends import Backend
from sm120.gateway.proxy import RouteCache
from sm120.gateway.swap import Swapper, SwapPolicy
from tests.fakes.gateway import FakeActions, backend, exchange, running_gateway
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.helpers import free_port

CHAT_PATH = "/v1/chat/completions"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_models_lists_every_backend_with_whether_it_is_awake() -> None:
    table = {
        "a": backend("a", "http://127.0.0.1:1"),
        "b": backend("b", "http://127.0.0.1:2", running=False),
    }

    status, _, raw = run(exchange(table, SwapPolicy(), FakeActions(table), "GET", "/v1/models"))
    body = json.loads(raw)
    assert status == 200
    assert [(m["id"], m["deployment"], m["awake"]) for m in body["data"]] == [
        ("a", "dep-a", True),
        ("b", "dep-b", False),
    ]


def test_v1_needs_the_gateway_key_and_health_does_not() -> None:
    table: dict[str, Backend] = {}

    async def scenario() -> list[int]:
        async with running_gateway(table, SwapPolicy(), FakeActions(table)) as (client, _):
            statuses = []
            for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}):
                async with client.get("/v1/models", headers=headers) as answer:
                    statuses.append(answer.status)
            async with client.get("/health", headers={"Authorization": ""}) as answer:
                statuses.append(answer.status)
            return statuses

    assert run(scenario()) == [401, 401, 200]


def test_unknown_model_is_404_listing_the_models() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1"), "b": backend("b", "http://127.0.0.1:2")}

    status, _, raw = run(
        exchange(
            table, SwapPolicy(), FakeActions(table), "POST", CHAT_PATH, json={**CHAT, "model": "c"}
        )
    )
    body = json.loads(raw)
    assert status == 404
    assert body["error"]["message"] == "model 'c' is not served here; models: a, b"
    assert body["error"]["models"] == ["a", "b"]


def test_a_streamed_chat_comes_through_byte_for_byte() -> None:
    with FakeOpenAIServer(api_key="backend-key", model="a") as fake:
        fake.default_reply = Reply(content="one two three")
        table = {"a": backend("a", fake.url, api_key="backend-key")}
        body = {**CHAT, "model": "a", "stream": True}

        actions = FakeActions(table)
        status, headers, relayed = run(
            exchange(table, SwapPolicy(), actions, "POST", CHAT_PATH, json=body)
        )
        kind = headers["Content-Type"]
        direct = httpx.post(
            f"{fake.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": "Bearer backend-key"},
        ).content
    assert status == 200 and kind == "text/event-stream"
    assert relayed == direct
    assert relayed.endswith(b"data: [DONE]\n\n")
    # The fake refuses any key but its own (401): the gateway swapped in the backend's key.
    assert fake.chat_requests[0]["model"] == "a"


def test_an_upstream_error_keeps_its_status_and_body() -> None:
    with FakeOpenAIServer(model="a") as fake:
        fake.script(Reply(status=400, error_message="max_tokens is too large"))
        table = {"a": backend("a", fake.url)}

        request = {**CHAT, "model": "a"}
        actions = FakeActions(table)
        status, _, raw = run(
            exchange(table, SwapPolicy(), actions, "POST", CHAT_PATH, json=request)
        )
        body = json.loads(raw)
    assert status == 400
    assert body == {"object": "error", "message": "max_tokens is too large", "code": 400}


def test_a_dead_backend_is_502_at_once() -> None:
    table = {"a": backend("a", f"http://127.0.0.1:{free_port()}")}

    async def scenario() -> Any:
        async with running_gateway(table, SwapPolicy(), FakeActions(table)) as (client, _):
            started = time.monotonic()
            async with client.post("/v1/chat/completions", json={**CHAT, "model": "a"}) as answer:
                return answer.status, await answer.json(), time.monotonic() - started

    status, body, took = run(scenario())
    assert status == 502
    assert body["error"]["message"].startswith("deployment dep-a did not answer: ")
    assert took < 3


def test_a_stopped_model_without_swapping_is_503_naming_the_way_out() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1", running=False)}
    actions = FakeActions(table)

    status, headers, raw = run(
        exchange(
            table, SwapPolicy(max_awake=0), actions, "POST", CHAT_PATH, json={**CHAT, "model": "a"}
        )
    )
    retry, body = headers.get("Retry-After"), json.loads(raw)
    assert status == 503 and retry is None
    assert body["error"]["message"] == (
        "model 'a' is not running (deployment dep-a) (hint: start it (sm120 launch ... --name "
        "dep-a), or let the gateway swap: sm120 gateway start --max-awake N)"
    )
    assert actions.done == []


def test_asking_for_a_stopped_model_stops_the_least_recently_used_and_starts_it() -> None:
    with FakeOpenAIServer(model="c") as fake:
        table = {
            "a": backend("a", "http://127.0.0.1:1"),
            "b": backend("b", "http://127.0.0.1:2"),
            "c": backend("c", fake.url, running=False),
        }
        actions = FakeActions(table)

        async def scenario() -> int:
            async with running_gateway(table, SwapPolicy(max_awake=2), actions) as (client, sw):
                sw.last_used.update({"dep-a": 2.0, "dep-b": 1.0})
                async with client.post("/v1/chat/completions", json={**CHAT, "model": "c"}) as a:
                    return a.status

        assert run(scenario()) == 200
    assert actions.done == ["stop dep-b", "start dep-c"]
    assert fake.chat_requests[0]["model"] == "c"


def test_sleep_mode_backends_sleep_and_wake_instead() -> None:
    with FakeOpenAIServer(model="b") as fake:
        table = {
            "a": backend("a", "http://127.0.0.1:1", sleep_mode=True),
            "b": backend("b", fake.url, sleep_mode=True),
        }
        actions = FakeActions(table)
        actions.sleeping.add("dep-b")  # put to sleep before the gateway started

        async def scenario() -> Any:
            async with running_gateway(table, SwapPolicy(max_awake=1), actions) as (client, _):
                async with client.get("/v1/models") as listed:
                    before = {m["id"]: m["awake"] for m in (await listed.json())["data"]}
                async with client.post(CHAT_PATH, json={**CHAT, "model": "b"}) as answer:
                    status = answer.status
                async with client.get("/v1/models") as listed:
                    after = {m["id"]: m["awake"] for m in (await listed.json())["data"]}
                return before, status, after

        before, status, after = run(scenario())
    assert before == {"a": True, "b": False}
    assert status == 200
    assert after == {"a": False, "b": True}
    assert actions.done == ["sleep dep-a", "wake dep-b"]


def test_a_swap_slower_than_the_wait_is_503_with_retry_after_and_goes_on() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1"), "b": backend("b", "http://127.0.0.1:2")}
    table["b"] = backend("b", "http://127.0.0.1:2", running=False)
    actions = FakeActions(table, delay_s=0.5)

    async def scenario() -> Any:
        policy = SwapPolicy(max_awake=1, wait_s=0.1)
        async with running_gateway(table, policy, actions) as (client, _):
            async with client.post("/v1/chat/completions", json={**CHAT, "model": "b"}) as answer:
                result = answer.status, answer.headers.get("Retry-After"), await answer.json()
            await asyncio.sleep(0.7)  # the swap was not cancelled with the request
            return result

    status, retry, body = run(scenario())
    assert status == 503 and retry == "30"
    assert body["error"]["message"] == (
        "model 'b' is still being started after 0 s (hint: retry in 30 s)"
    )
    assert table["b"].running is True


def test_a_failed_start_is_503_with_the_reason() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1", running=False)}
    actions = FakeActions(table)
    actions.fail_start = "the engine exited with code 1 before it was ready"

    status, headers, raw = run(
        exchange(
            table, SwapPolicy(max_awake=1), actions, "POST", CHAT_PATH, json={**CHAT, "model": "a"}
        )
    )
    retry, body = headers.get("Retry-After"), json.loads(raw)
    assert status == 503 and retry == "30"
    assert body["error"]["message"] == (
        "switching to 'a' failed: the engine exited with code 1 before it was ready "
        "(hint: see the log)"
    )


def test_no_room_when_what_runs_cannot_be_started_again() -> None:
    table = {
        "a": backend("a", "http://127.0.0.1:1", startable=False),
        "b": backend("b", "http://127.0.0.1:2", running=False),
    }
    actions = FakeActions(table)

    status, _, raw = run(
        exchange(
            table,
            SwapPolicy(max_awake=1),
            actions,
            "POST",
            "/v1/completions",
            json={"model": "b", "prompt": "x"},
        )
    )
    body = json.loads(raw)
    assert status == 503
    assert body["error"]["message"] == (
        "no room for 'b': dep-a already run and the gateway cannot "
        "start them again (hint: stop one (sm120 stop NAME), or raise --max-awake)"
    )
    assert actions.done == []


def test_a_body_that_is_not_json_is_400_and_names_no_model_problem() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1")}

    status, _, raw = run(
        exchange(
            table, SwapPolicy(), FakeActions(table), "POST", "/v1/completions", data=b"not json"
        )
    )
    body = json.loads(raw)
    assert status == 400
    assert body["error"]["message"] == "the request body is not valid JSON"


def test_a_request_without_a_model_is_400_when_several_models_are_served() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1"), "b": backend("b", "http://127.0.0.1:2")}

    status, _, raw = run(
        exchange(table, SwapPolicy(), FakeActions(table), "POST", "/v1/completions", json={})
    )
    body = json.loads(raw)
    assert status == 400
    assert body["error"]["message"] == "the request names no model; models: a, b"


def test_the_routing_table_is_reused_briefly_and_reread_when_it_may_be_wrong() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1"), "b": backend("b", "http://127.0.0.1:2")}
    reads: list[int] = []

    async def discover() -> dict[str, Backend]:
        reads.append(1)
        return dict(table)

    swapper = Swapper(SwapPolicy(), FakeActions(table), discover)

    async def scenario() -> list[int]:
        routes = RouteCache(swapper, ttl_s=60)
        counts = []
        for model in ("a", "a", "b"):  # a running model within the TTL: no new read
            await routes.lookup(model)
            counts.append(len(reads))
        await routes.lookup("c")  # not in the table: read again, it may be new
        counts.append(len(reads))
        table["a"] = backend("a", "http://127.0.0.1:1", running=False)
        await routes.lookup("a")  # cached as running: still no read
        counts.append(len(reads))
        swapper.swap_events += 1  # a swap began: what the table says may be wrong
        found, _ = await routes.lookup("a")
        counts.append(len(reads))
        assert found is not None and not found.running
        await routes.lookup("a")  # down: always read afresh
        counts.append(len(reads))
        return counts

    assert run(scenario()) == [1, 1, 1, 2, 2, 3, 4]


def test_a_stale_table_is_served_then_renewed_after_the_answer_and_readers_share_a_read() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1")}
    reads: list[float] = []

    async def discover() -> dict[str, Backend]:
        reads.append(time.monotonic())
        await asyncio.sleep(0.05)  # the state files take a while to read
        return dict(table)

    swapper = Swapper(SwapPolicy(), FakeActions(table), discover)

    async def scenario() -> tuple[int, int, float, int]:
        routes = RouteCache(swapper, ttl_s=0.0)
        # 64 streams open at once on a cold gateway: one read between them.
        await asyncio.gather(*(routes.lookup("a") for _ in range(64)))
        first = len(reads)
        began = time.monotonic()
        found, _ = await routes.lookup("a")  # stale (TTL 0), running: answered at once
        waited = time.monotonic() - began
        assert found is not None
        routes.renew_if_stale()  # what a request does once its answer is out
        routes.renew_if_stale()  # a second one while the first read runs starts none
        await asyncio.sleep(0.1)  # the background read ends
        return first, len(reads), waited, len(reads)

    first, after, waited, _ = run(scenario())
    assert first == 1
    assert after == 2  # the renewal happened, off the request's path
    assert waited < 0.04


WRONG_KEY = {"Authorization": "Bearer no"}


def test_answers_a_retry_cannot_change_say_so_and_the_others_do_not() -> None:
    """x-should-retry: false on a wrong key, an unknown model or path, a malformed body, a
    method aiohttp refuses and the engine's own 400; none on the 429 a retry may get past,
    the 502 of a dead deployment or the 503 of a stopped one."""
    with FakeOpenAIServer(model="a") as fake:
        fake.script(Reply(status=400, error_message="bad tool"), Reply(status=429))
        table = {
            "a": backend("a", fake.url),
            "dead": backend("dead", f"http://127.0.0.1:{free_port()}"),
            "off": backend("off", "http://127.0.0.1:1", running=False),
        }
        asks: list[tuple[str, str, dict[str, Any]]] = [
            ("POST", CHAT_PATH, {"json": {**CHAT, "model": "a"}, "headers": WRONG_KEY}),
            ("POST", CHAT_PATH, {"json": {**CHAT, "model": "nope"}}),
            ("POST", CHAT_PATH, {"data": b"{not json"}),
            ("GET", "/v1/no-such-path", {}),
            ("GET", CHAT_PATH, {}),
            ("POST", CHAT_PATH, {"json": {**CHAT, "model": "a"}}),
            ("POST", CHAT_PATH, {"json": {**CHAT, "model": "a"}}),
            ("POST", CHAT_PATH, {"json": {**CHAT, "model": "dead"}}),
            ("POST", CHAT_PATH, {"json": {**CHAT, "model": "off"}}),
        ]

        async def scenario() -> list[tuple[int, str | None]]:
            seen = []
            policy = SwapPolicy(max_awake=0)
            async with running_gateway(table, policy, FakeActions(table)) as (client, _):
                for method, path, extra in asks:
                    async with client.request(method, path, **extra) as answer:
                        seen.append((answer.status, answer.headers.get("x-should-retry")))
            return seen

        seen = run(scenario())
    assert seen == [
        (401, "false"), (404, "false"), (400, "false"), (404, "false"), (405, "false"),
        (400, "false"), (429, None), (502, None), (503, None),
    ]  # fmt: skip
