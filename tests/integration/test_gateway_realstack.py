"""The gateway in front of two real tiny vLLM CPU engines: listing, streaming fidelity,
unknown models, the official Anthropic and OpenAI SDKs as a coding agent drives them (tools,
forced tool choice, streaming, count_tokens, the Responses API, both key headers, an alias),
a killed backend, and the stop/start swap. One pair of engines serves the whole module (each
start costs ~45 s of the 2 CI cores); the tests that kill or swap engines come last."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.helpers import free_port, port_is_free
from tests.integration.realstack import engine_processes, sm120, state_of

pytestmark = pytest.mark.integration

MODELS = ("tiny-a", "tiny-b")
# What Claude Code asks for by default; the gateway sends it to tiny-a.
ALIAS = "claude-sonnet-4-5"
CHAT = {"messages": [{"role": "user", "content": "Count with me: one"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("home")
    ports = {name: free_port() for name in MODELS}
    for name in MODELS:
        # Both are the agent variant (64k context, hermes tools) that Claude Code's and
        # Codex's own prompts fit; tiny-b also caps every reply (vLLM reads the generation
        # config's max_new_tokens as a cap, not only a default) for Codex, which sends no
        # max_output_tokens: tests/integration/agent_protocol.py drives the real clients.
        agent = ("-V", "agent")
        if name == "tiny-b":
            agent += ("--set", 'override-generation-config={"max_new_tokens": 64}')
        launched = sm120(
            home, "launch", "tiny", *agent,
            "--name", name, "--set", f"model.served_name={name}",
            "--port", str(ports[name]), "--model-dir", str(tiny_model), "--no-monitor",
            # What a coding agent's deployment runs with: vLLM 0.32 refuses a named
            # tool_choice without a tool parser.
            "--set", "enable-auto-tool-choice=true", "--set", "tool-call-parser=hermes",
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr[-3000:]
    gateway_port = free_port()
    started = sm120(
        home, "gateway", "start", "--port", str(gateway_port), "--alias", f"{ALIAS}=tiny-a"
    )
    assert started.returncode == 0, started.stderr
    info = {"home": home, "ports": ports, "gateway": f"http://127.0.0.1:{gateway_port}"}
    info["key"] = (home / "gateway" / "api_key").read_text().strip()
    yield info
    sm120(home, "gateway", "stop")
    for name in MODELS:
        sm120(home, "stop", name)
    for port in ports.values():
        assert engine_processes(port) == []


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _backend_key(stack: dict[str, Any], name: str) -> str:
    return (Path(stack["home"]) / "deployments" / name / "api_key").read_text().strip()


def _streamed(url: str, key: str, model: str, timeout: float = 120) -> tuple[list[str], str | None]:
    """The content pieces of a streamed greedy chat, and its finish reason."""
    body = {**CHAT, "model": model, "stream": True, "temperature": 0}
    pieces: list[str] = []
    finish = None
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=_auth(key), timeout=timeout
    ) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line.removeprefix("data: "))["choices"][0]
            pieces.append(choice["delta"].get("content") or "")
            finish = choice["finish_reason"] or finish
    return pieces, finish


def _models(stack: dict[str, Any]) -> dict[str, bool]:
    listed = httpx.get(f"{stack['gateway']}/v1/models", headers=_auth(stack["key"]), timeout=30)
    assert listed.status_code == 200
    # Aliases are listed too (with alias_of); these tests follow the deployments' own names.
    return {e["id"]: e["awake"] for e in listed.json()["data"] if "alias_of" not in e}


def test_models_lists_both_awake_and_the_alias(stack: dict[str, Any]) -> None:
    assert _models(stack) == {"tiny-a": True, "tiny-b": True}
    listed = httpx.get(f"{stack['gateway']}/v1/models", headers=_auth(stack["key"]), timeout=30)
    aliases = [e for e in listed.json()["data"] if "alias_of" in e]
    assert [(e["id"], e["served_model"], e["awake"]) for e in aliases] == [(ALIAS, "tiny-a", True)]


def test_a_streamed_chat_through_the_gateway_matches_a_direct_one(stack: dict[str, Any]) -> None:
    for name in MODELS:
        direct = _streamed(
            f"http://127.0.0.1:{stack['ports'][name]}", _backend_key(stack, name), name
        )
        relayed = _streamed(stack["gateway"], stack["key"], name)
        # Greedy: the same text and finish. How vLLM groups tokens into events depends on
        # its own timing (a loaded machine merges steps), so the events are not compared;
        # that the gateway keeps every event as sent is the byte-for-byte unit test's.
        assert ("".join(relayed[0]), relayed[1]) == ("".join(direct[0]), direct[1])
        assert len([piece for piece in relayed[0] if piece]) >= 2
    # Both streams took the front's fast path (sm120.gateway.front), not the application's.
    health = httpx.get(f"{stack['gateway']}/health", timeout=10).json()
    assert health["fast_path"]["answered"] >= 2


def test_the_backend_key_does_not_open_the_gateway(stack: dict[str, Any]) -> None:
    answer = httpx.get(
        f"{stack['gateway']}/v1/models", headers=_auth(_backend_key(stack, "tiny-a")), timeout=30
    )
    assert answer.status_code == 401


def test_an_unknown_model_is_404_listing_the_models(stack: dict[str, Any]) -> None:
    answer = httpx.post(
        f"{stack['gateway']}/v1/completions",
        json={"model": "tiny-c", "prompt": "hi", "max_tokens": 2},
        headers=_auth(stack["key"]),
        timeout=30,
    )
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["message"] == (
        "model 'tiny-c' is not served here; models: tiny-a, tiny-b; aliases: claude-sonnet-4-5"
    )
    assert error["models"] == ["tiny-a", "tiny-b"]


def test_an_upstream_error_keeps_vllms_status(stack: dict[str, Any]) -> None:
    body = {**CHAT, "model": "tiny-a", "max_tokens": 100_000}
    relayed = httpx.post(
        f"{stack['gateway']}/v1/chat/completions",
        json=body,
        headers=_auth(stack["key"]),
        timeout=60,
    )
    direct = httpx.post(
        f"http://127.0.0.1:{stack['ports']['tiny-a']}/v1/chat/completions",
        json=body,
        headers=_auth(_backend_key(stack, "tiny-a")),
        timeout=60,
    )
    assert direct.status_code == 400
    assert (relayed.status_code, relayed.json()) == (direct.status_code, direct.json())


# --- coding-agent clients: the official SDKs, as Claude Code and Codex drive the endpoint ---
# The model is random: its words are noise, so these check the protocol. A forced tool choice
# on a strict tool makes vLLM decode the input under the tool's JSON schema (vLLM 0.32 pins
# the arguments only for strict tools: without it the random model's input came back as a
# bare number, which vLLM's own Anthropic converter then refused with a 400). The schema is
# all enums, so only whitespace is free: answers ran 87-155 tokens here, hence 512.

TOOL_TOKENS = 512
WEATHER_TOOL = {
    "name": "get_weather",
    "strict": True,
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
PROTOCOL_EVENTS = frozenset(
    {
        "message_start", "content_block_start", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    }
)  # fmt: skip


def _anthropic(
    stack: dict[str, Any], api_key: str | None = None, auth_token: str | None = None
) -> Any:
    import anthropic

    if auth_token is None and api_key is None:
        api_key = stack["key"]
    return anthropic.Anthropic(
        base_url=stack["gateway"], api_key=api_key, auth_token=auth_token, max_retries=0,
        timeout=120,
    )  # fmt: skip


def _openai(stack: dict[str, Any], key: str | None = None) -> Any:
    import openai

    return openai.OpenAI(
        base_url=f"{stack['gateway']}/v1", api_key=key or stack["key"], max_retries=0, timeout=120
    )


def _valid_weather(arguments: Any) -> None:
    jsonschema.validate(arguments, WEATHER_TOOL["input_schema"])


def test_anthropic_sdk_forced_tool_use_through_an_alias_with_x_api_key(
    stack: dict[str, Any],
) -> None:
    client = _anthropic(stack)  # api_key= sends x-api-key
    message = client.messages.create(
        model=ALIAS, max_tokens=TOOL_TOKENS, messages=ASK, tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
    )  # fmt: skip
    uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use", message
    assert [use.name for use in uses] == ["get_weather"]
    assert uses[0].id
    _valid_weather(uses[0].input)
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_anthropic_sdk_streams_a_tool_use_in_protocol_order_with_a_bearer_key(
    stack: dict[str, Any],
) -> None:
    client = _anthropic(stack, auth_token=stack["key"])  # auth_token= sends Bearer
    kinds: list[str] = []
    with client.messages.stream(
        model="tiny-a", max_tokens=TOOL_TOKENS, messages=ASK, tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:  # fmt: skip
        for event in stream:
            # Deltas collapse into one entry: the order of the other events is the protocol.
            repeated = kinds[-1:] == [event.type] == ["content_block_delta"]
            if event.type in PROTOCOL_EVENTS and not repeated:
                kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1
    uses = [block for block in final.content if block.type == "tool_use"]
    assert final.stop_reason == "tool_use" and [use.name for use in uses] == ["get_weather"]
    _valid_weather(uses[0].input)


def test_anthropic_count_tokens_matches_what_a_request_is_billed(stack: dict[str, Any]) -> None:
    client = _anthropic(stack)
    counted = client.messages.count_tokens(model=ALIAS, messages=ASK)
    answered = client.messages.create(model=ALIAS, max_tokens=2, messages=ASK)
    assert counted.input_tokens == answered.usage.input_tokens > 0


def test_anthropic_sdk_errors_name_the_cause(stack: dict[str, Any]) -> None:
    import anthropic

    with pytest.raises(anthropic.AuthenticationError):
        _anthropic(stack, api_key="wrong").messages.create(model=ALIAS, max_tokens=2, messages=ASK)
    with pytest.raises(anthropic.NotFoundError) as missing:
        _anthropic(stack).messages.create(model="claude-opus-4", max_tokens=2, messages=ASK)
    assert "models: tiny-a, tiny-b; aliases: claude-sonnet-4-5" in str(missing.value)
    too_big = [{"role": "user", "content": "x" * (33 * 1024 * 1024)}]
    with pytest.raises(anthropic.APIStatusError) as refused:
        _anthropic(stack).messages.create(model=ALIAS, max_tokens=2, messages=too_big)
    assert refused.value.status_code == 413


def test_openai_sdk_responses_api_answers_and_streams_in_order(stack: dict[str, Any]) -> None:
    client = _openai(stack)
    response = client.responses.create(model=ALIAS, input="Say hi.", max_output_tokens=8)
    assert response.status in ("completed", "incomplete")
    assert response.usage is not None and response.usage.input_tokens > 0
    kinds = [
        event.type
        for event in client.responses.create(
            model="tiny-b", input="Say hi.", max_output_tokens=8, stream=True
        )
    ]
    assert kinds[0] == "response.created"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds


def test_openai_sdk_forced_tool_call_arguments_fit_the_schema(stack: dict[str, Any]) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": WEATHER_TOOL["description"],
            "parameters": WEATHER_TOOL["input_schema"],
            "strict": True,
        },
    }
    completion = _openai(stack).chat.completions.create(
        model="tiny-a", messages=ASK, max_tokens=TOOL_TOKENS, tools=[tool],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    calls = completion.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    _valid_weather(json.loads(calls[0].function.arguments))
    assert completion.usage is not None and completion.usage.prompt_tokens > 0


def test_a_clients_tool_definitions_reach_the_engines_prompt(stack: dict[str, Any]) -> None:
    """The tiny model's chat template renders `tools` (it dropped them once): what the engine
    is asked holds the tool, and an Anthropic client's tools count in its prompt."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    body = {"model": ALIAS, "messages": ASK, "tools": [tool]}
    tokens = httpx.post(
        f"{stack['gateway']}/tokenize", json=body, headers=_auth(stack["key"]), timeout=30
    ).json()["tokens"]
    prompt = httpx.post(
        f"{stack['gateway']}/detokenize", json={"model": ALIAS, "tokens": tokens},
        headers=_auth(stack["key"]), timeout=30,
    ).json()["prompt"]  # fmt: skip
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in prompt
    assert "within <tool_call></tool_call>" in prompt
    client = _anthropic(stack)
    bare = client.messages.count_tokens(model=ALIAS, messages=ASK).input_tokens
    with_tool = client.messages.count_tokens(model=ALIAS, messages=ASK, tools=[WEATHER_TOOL])
    assert with_tool.input_tokens > bare + 50


def _counting_client(sdk: Any, sent: list[str]) -> Any:
    """The SDK's own HTTP client (its httpx fork), noting the path of every request it sends."""
    return sdk.DefaultHttpxClient(
        event_hooks={"request": [lambda request: sent.append(request.url.path)]}
    )


def test_a_final_answer_costs_an_sdk_one_request_not_its_retries(stack: dict[str, Any]) -> None:
    """The official SDKs retry twice by default, and always on a 5xx; x-should-retry: false on
    a wrong key and on a protocol the engine lacks (the engine's route miss, a 501) ends that
    at the first answer. Without the header the 501 costs three requests and their backoff."""
    import anthropic
    import openai

    sent: list[str] = []
    wrong_key = anthropic.Anthropic(
        base_url=stack["gateway"], api_key="wrong", max_retries=2, timeout=60,
        http_client=_counting_client(anthropic, sent),
    )  # fmt: skip
    started = time.monotonic()
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong_key.messages.create(model=ALIAS, max_tokens=2, messages=ASK)
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert sent == ["/v1/messages"]
    sdk = openai.OpenAI(
        base_url=f"{stack['gateway']}/v1", api_key=stack["key"], max_retries=2, timeout=60,
        http_client=_counting_client(openai, sent),
    )  # fmt: skip
    with pytest.raises(openai.APIStatusError) as lacking:
        sdk.embeddings.create(model="tiny-a", input="hello")
    took = time.monotonic() - started
    assert lacking.value.status_code == 501
    assert "does not serve /v1/embeddings" in lacking.value.message
    assert sent == ["/v1/messages", "/v1/embeddings"]
    assert took < 5  # two answers, no backoff (the SDKs wait 0.5-8 s between tries)
    # Both are in the gateway's access log (the engine never saw the 401), and no key is.
    time.sleep(1.0)  # the log is written from memory twice a second
    shown = sm120(Path(stack["home"]), "logs", "--gateway", "-n", "200")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any(
        " POST /v1/messages model=- deployment=- status=401 " in line and line.endswith(" via=app")
        for line in lines
    ), lines[-5:]
    assert any(
        " POST /v1/embeddings model=tiny-a deployment=tiny-a status=501 " in line
        and line.endswith(" via=fast")
        for line in lines
    ), lines[-5:]
    assert any(" event=start " in line for line in lines)
    text = (Path(stack["home"]) / "gateway" / "access.log").read_text()
    assert stack["key"] not in text and _backend_key(stack, "tiny-a") not in text


def test_tokenize_is_routed_by_model_and_needs_the_key(stack: dict[str, Any]) -> None:
    body = {"model": ALIAS, "prompt": "hello there"}
    refused = httpx.post(f"{stack['gateway']}/tokenize", json=body, timeout=30)
    counted = httpx.post(
        f"{stack['gateway']}/tokenize", json=body, headers=_auth(stack["key"]), timeout=30
    )
    assert refused.status_code == 401
    assert counted.status_code == 200 and counted.json()["count"] > 0


def _add_key(stack: dict[str, Any], name: str, *options: str) -> str:
    added = sm120(Path(stack["home"]), "gateway", "keys", "add", name, *options)
    assert added.returncode == 0, added.stderr
    return added.stdout.strip()


def _until_refused(make_call: Any, error: type[Exception], timeout: float = 5.0) -> None:
    """The running gateway re-reads its key store within a second of a change."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            make_call()
        except error:
            return
        assert time.monotonic() < deadline, "the change never took effect"
        time.sleep(0.2)


def test_two_keys_one_held_to_a_model_one_to_a_rate_through_the_official_sdks(
    stack: dict[str, Any],
) -> None:
    import anthropic
    import openai

    held = _add_key(stack, "held", "--models", "tiny-a")
    rated = _add_key(stack, "rated", "--rpm", "2")
    time.sleep(0.7)  # the store is looked at twice a second
    client = _openai(stack, held)
    answered = client.chat.completions.create(model="tiny-a", messages=ASK, max_tokens=4)
    assert answered.usage is not None and answered.usage.prompt_tokens > 0
    with pytest.raises(openai.NotFoundError) as other:
        client.chat.completions.create(model="tiny-b", messages=ASK, max_tokens=4)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=ASK, max_tokens=4)
    # The same 404 as a model that is not there, naming only what the key may use.
    assert other.value.status_code == missing.value.status_code == 404
    assert str(other.value).endswith("model 'tiny-b' is not served here; models: tiny-a")
    assert str(missing.value).endswith("model 'no-such-model' is not served here; models: tiny-a")
    assert [m.id for m in client.models.list()] == ["tiny-a"]
    # The rate-limited key, with the Anthropic SDK (x-api-key) and a stream: two per minute.
    limited = _anthropic(stack, api_key=rated)
    for _ in range(2):
        with limited.messages.stream(model="tiny-b", max_tokens=4, messages=ASK) as stream:
            assert stream.get_final_message().usage.output_tokens > 0
    with pytest.raises(anthropic.RateLimitError) as refused:
        limited.messages.create(model="tiny-b", max_tokens=4, messages=ASK)
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60
    assert "rate_limit_error" in str(refused.value.body)
    with pytest.raises(openai.RateLimitError) as refused_openai:
        _openai(stack, rated).chat.completions.create(model="tiny-b", messages=ASK, max_tokens=4)
    assert "rate_limit_exceeded" in str(refused_openai.value.body)
    # Usage, by key, from the engine's own usage in each answer (the writer runs behind).
    deadline = time.monotonic() + 10
    while True:
        listed = sm120(Path(stack["home"]), "gateway", "usage", "--by", "key", "--json")
        rows = {row["key"]: row for row in json.loads(listed.stdout or "[]")}
        if rows.get("rated", {}).get("requests") == 4 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert rows["held"]["requests"] == 3 and rows["held"]["errors"] == 2
    assert rows["held"]["prompt_tokens"] == answered.usage.prompt_tokens
    # Refusals are recorded too: two answered, two refused.
    assert rows["rated"]["requests"] == 4 and rows["rated"]["errors"] == 2
    assert rows["rated"]["completion_tokens"] > 0
    metrics = httpx.get(f"{stack['gateway']}/metrics", headers=_auth(stack["key"]), timeout=10)
    assert 'sm120_gateway_refused_total{key="rated",reason="rpm"} 2' in metrics.text
    assert 'sm120_gateway_requests_total{key="held",model="tiny-a",status="200"} 1' in metrics.text


def test_revoke_and_rotate_take_effect_without_a_restart(stack: dict[str, Any]) -> None:
    import openai

    old = _add_key(stack, "turner")
    time.sleep(0.7)
    ask = {"model": "tiny-a", "messages": ASK, "max_tokens": 2}
    assert _openai(stack, old).chat.completions.create(**ask).choices
    rotated = sm120(Path(stack["home"]), "gateway", "keys", "rotate", "turner")
    new = rotated.stdout.strip()
    _until_refused(lambda: _openai(stack, old).chat.completions.create(**ask),
                   openai.AuthenticationError)  # fmt: skip
    assert _openai(stack, new).chat.completions.create(**ask).choices
    assert sm120(Path(stack["home"]), "gateway", "keys", "revoke", "turner").returncode == 0
    _until_refused(lambda: _openai(stack, new).chat.completions.create(**ask),
                   openai.AuthenticationError)  # fmt: skip


def test_two_credentials_are_refused_on_both_paths(stack: dict[str, Any]) -> None:
    body = json.dumps({**CHAT, "model": "tiny-a"}).encode()
    key = stack["key"]
    doubled = [
        [("Authorization", f"Bearer {key}"), ("Authorization", "Bearer wrong")],
        [("Authorization", "Bearer wrong"), ("x-api-key", key)],
    ]
    before = httpx.get(f"{stack['gateway']}/health", timeout=10).json()["fast_path"]
    for headers in doubled:
        sent = [*headers, ("Content-Type", "application/json")]
        # The fast path hands them over; the application refuses them.
        answer = httpx.post(f"{stack['gateway']}/v1/chat/completions", content=body,
                            headers=sent, timeout=30)  # fmt: skip
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["message"].startswith("two different credentials")
        # And straight at the application (a chunked body is never the fast path's).
        chunked = httpx.post(f"{stack['gateway']}/v1/chat/completions", content=iter([body]),
                             headers=sent, timeout=30)  # fmt: skip
        assert chunked.status_code == 401
        assert chunked.json()["error"]["message"].startswith("two different credentials")
    after = httpx.get(f"{stack['gateway']}/health", timeout=10).json()["fast_path"]
    # The four, and the GET /health that reads the count (the application answers it too).
    assert after["handed_over"] - before["handed_over"] == 5


# The Responses conformance set and the real clients, on these engines (before the tests
# that kill and swap them).
from tests.integration.agent_protocol import (  # noqa: E402
    test_a_gateway_that_is_down_ends_claude_code_in_seconds_and_codex_waits,
    test_a_previous_response_the_engine_never_kept_is_answered_with_why,
    test_a_wrong_key_ends_both_clients_within_seconds,
    test_claude_code_completes_a_turn_through_connect_write,
    test_codex_completes_a_turn_through_connect_write,
    test_codex_first_request_shape_streams_the_events_codex_reads,
    test_codex_forced_tool_call_is_well_formed_and_its_output_goes_back,
    test_codex_shapes_answer_without_streaming_too,
)

__all__ = [
    "test_a_gateway_that_is_down_ends_claude_code_in_seconds_and_codex_waits",
    "test_a_previous_response_the_engine_never_kept_is_answered_with_why",
    "test_a_wrong_key_ends_both_clients_within_seconds",
    "test_claude_code_completes_a_turn_through_connect_write",
    "test_codex_completes_a_turn_through_connect_write",
    "test_codex_first_request_shape_streams_the_events_codex_reads",
    "test_codex_forced_tool_call_is_well_formed_and_its_output_goes_back",
    "test_codex_shapes_answer_without_streaming_too",
]


def test_a_killed_backend_answers_503_within_seconds(stack: dict[str, Any]) -> None:
    state = state_of(Path(stack["home"]), "tiny-b")
    assert state is not None and state["engine_pid"]
    os.kill(state["engine_pid"], signal.SIGKILL)
    started = time.monotonic()
    answer = httpx.post(
        f"{stack['gateway']}/v1/chat/completions",
        json={**CHAT, "model": "tiny-b"},
        headers=_auth(stack["key"]),
        timeout=30,
    )
    took = time.monotonic() - started
    assert answer.status_code in (502, 503), answer.text
    assert took < 10
    assert answer.json()["error"]["message"].startswith(
        ("model 'tiny-b' is not running", "deployment tiny-b did not answer")
    )
    # The engine's supervisor records the kill within a moment; then it is listed asleep.
    deadline = time.monotonic() + 10
    while _models(stack)["tiny-b"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _models(stack) == {"tiny-a": True, "tiny-b": False}


def test_the_gateway_swaps_by_stop_and_start(stack: dict[str, Any]) -> None:
    """With room for one, asking for the dead tiny-b stops tiny-a and starts tiny-b again
    from its saved launch spec (warm compile cache), and the request is answered."""
    home = Path(stack["home"])
    port = int(stack["gateway"].rsplit(":", 1)[1])
    assert sm120(home, "gateway", "stop").returncode == 0
    started = sm120(home, "gateway", "start", "--port", str(port), "--max-awake", "1")
    assert started.returncode == 0, started.stderr
    began = time.monotonic()
    # The request waits through the swap: a start takes about a minute on 2 busy cores.
    pieces, finish = _streamed(stack["gateway"], stack["key"], "tiny-b", timeout=500)
    swap_s = time.monotonic() - began
    print(f"\nswap (stop tiny-a, start tiny-b, answer): {swap_s:.1f} s")
    assert finish is not None and any(pieces)
    assert _models(stack) == {"tiny-a": False, "tiny-b": True}
    assert state_of(home, "tiny-a") is None
    assert port_is_free(stack["ports"]["tiny-a"])
    assert engine_processes(stack["ports"]["tiny-a"]) == []
    assert swap_s < 300
    # The access log tells the gateway's life: the restart and the swap, in order.
    events = [
        line.split(" ", 1)[1]
        for line in (home / "gateway" / "access.log").read_text().splitlines()
        if " event=" in line
    ]
    assert [e.split()[0] for e in events][-4:] == [
        "event=stop", "event=start", "event=swap", "event=swap"
    ]  # fmt: skip
    assert events[-2:] == ["event=swap action=stop deployment=tiny-a",
                           "event=swap action=start deployment=tiny-b"]  # fmt: skip
