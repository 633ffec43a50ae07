from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from sm120.core.errors import SM120Error
from sm120.server import client as client_module
from sm120.server import wire
from sm120.server.client import (
    ApiKeyRejected,
    BadServerResponse,
    ServerClient,
    ServerUnreachable,
    smoke_test,
)
from sm120.server.transport import TransportWording, translate_transport_errors
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.helpers import free_port

SECRET = "sk-test-3f9a1c-do-not-leak"
MODEL = "fake-model"


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(model=MODEL) as fake:
        yield fake


@pytest.fixture
def client(server: FakeOpenAIServer) -> Iterator[ServerClient]:
    with ServerClient(server.url) as http:
        yield http


def test_health_and_models(client: ServerClient) -> None:
    assert client.health() == 200
    assert client.models() == [MODEL]


def test_base_url_with_v1_suffix_reaches_the_same_server(server: FakeOpenAIServer) -> None:
    with ServerClient(server.url + "/v1/") as http:
        assert http.base_url == server.url
        assert http.models() == [MODEL]


def test_health_reports_unhealthy_status() -> None:
    with FakeOpenAIServer(health_status=503) as fake, ServerClient(fake.url) as http:
        assert http.health() == 503


def test_refused_connection_gives_no_health_and_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with ServerClient(url, timeout=2.0) as http:
        assert http.health() is None
        with pytest.raises(ServerUnreachable) as caught:
            http.models()
    assert caught.value.message == f"server not reachable at {url}"


URL = "http://127.0.0.1:9"
CLIENT_LINES = [
    "server not reachable at http://127.0.0.1:9 (hint: check that the server is running and "
    "listening on that host and port)",
    "/v1/models on http://127.0.0.1:9 did not answer within the client timeout (hint: the "
    "server may be busy compiling or wedged; check its log)",
    "connection to http://127.0.0.1:9 broke during /v1/models (RemoteProtocolError) (hint: the "
    "server may have crashed; check its log)",
]
WIRE_LINES = [
    "server not reachable at http://127.0.0.1:9 (hint: check that the deployment is running: "
    "sm120 status)",
    "/v1/models on http://127.0.0.1:9 did not answer in time (hint: the server may be compiling "
    "a new shape or wedged; check 'sm120 logs')",
    "connection to http://127.0.0.1:9 broke during /v1/models (RemoteProtocolError) (hint: the "
    "server may have crashed; check 'sm120 logs')",
]


@pytest.mark.parametrize(
    ("wording", "lines"),
    [(client_module._WORDING, CLIENT_LINES), (wire._WORDING, WIRE_LINES)],
    ids=["client", "wire"],
)
def test_transport_errors_read_as_each_door_words_them(
    wording: TransportWording, lines: list[str]
) -> None:
    failures = [
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
        httpx.RemoteProtocolError("cut"),
    ]
    seen = []
    for failure in failures:
        with (
            pytest.raises(SM120Error) as caught,
            translate_transport_errors(URL, "/v1/models", wording),
        ):
            raise failure
        assert caught.value.__cause__ is failure
        seen.append(caught.value.one_line())
    assert seen == lines


def test_non_streaming_splits_reasoning_and_content(
    server: FakeOpenAIServer, client: ServerClient
) -> None:
    server.script(Reply(content="Paris.", reasoning="The capital is Paris.", completion_tokens=9))
    result = client.chat([{"role": "user", "content": "capital?"}], MODEL, max_tokens=50)
    assert result.content == "Paris."
    assert result.reasoning == "The capital is Paris."
    assert result.finish_reason == "stop"
    assert result.completion_tokens == 9
    assert result.ttft_s is None
    assert result.decode_tps is None
    assert result.total_s > 0
    assert server.chat_requests[0]["max_tokens"] == 50
    assert "chat_template_kwargs" not in server.chat_requests[0]


def test_non_streaming_reads_reasoning_content_field(
    server: FakeOpenAIServer, client: ServerClient
) -> None:
    server.script(
        Reply(content="42", reasoning="six times seven", reasoning_field="reasoning_content")
    )
    result = client.chat([{"role": "user", "content": "6*7"}], MODEL)
    assert (result.reasoning, result.content) == ("six times seven", "42")


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_streaming_reports_deltas_in_order(
    server: FakeOpenAIServer, client: ServerClient, field: str
) -> None:
    server.script(Reply(content="It is 4.", reasoning="two plus two", reasoning_field=field))
    seen: list[tuple[str, str]] = []
    result = client.chat(
        [{"role": "user", "content": "2+2"}],
        MODEL,
        stream=True,
        on_delta=lambda kind, text: seen.append((kind, text)),
    )
    assert seen == [
        ("reasoning", "two "),
        ("reasoning", "plus "),
        ("reasoning", "two"),
        ("content", "It "),
        ("content", "is "),
        ("content", "4."),
    ]
    assert result.reasoning == "two plus two"
    assert result.content == "It is 4."
    assert result.finish_reason == "stop"
    assert result.completion_tokens == 6


def test_streaming_asks_for_usage(server: FakeOpenAIServer, client: ServerClient) -> None:
    client.chat([{"role": "user", "content": "hi"}], MODEL, stream=True)
    body = server.chat_requests[0]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_streaming_timings_follow_the_scripted_delays(
    server: FakeOpenAIServer, client: ServerClient
) -> None:
    first_delay, token_delay = 0.3, 0.1
    words = "one two three four five six"
    server.script(Reply(content=words, first_delay=first_delay, token_delay=token_delay))
    result = client.chat([{"role": "user", "content": "count"}], MODEL, stream=True)
    assert result.ttft_s is not None
    # The empty role-only chunk arrives at once; TTFT must wait for real text.
    assert first_delay <= result.ttft_s < first_delay + 1.0
    # the server's sleeps and our clock differ by scheduling jitter (1.2 ms seen under load)
    assert result.total_s >= result.ttft_s + 5 * token_delay * 0.9
    # 5 tokens after the first, one every 100 ms: 10 tok/s. Counting the first token too
    # would give 12, so the upper bound leaves room for jitter but not for that mistake.
    assert result.decode_tps is not None
    assert 5.0 < result.decode_tps <= 11.0


def test_decode_rate_is_none_without_usage(server: FakeOpenAIServer, client: ServerClient) -> None:
    server.script(Reply(content="word", completion_tokens=1))
    result = client.chat([{"role": "user", "content": "hi"}], MODEL, stream=True)
    assert result.completion_tokens == 1
    assert result.decode_tps is None


@pytest.mark.parametrize("thinking", [False, True])
def test_thinking_toggle_sends_both_template_kwargs(
    server: FakeOpenAIServer, client: ServerClient, thinking: bool
) -> None:
    client.chat([{"role": "user", "content": "hi"}], MODEL, thinking=thinking)
    assert server.chat_requests[0]["chat_template_kwargs"] == {
        "enable_thinking": thinking,
        "thinking": thinking,
    }


def test_bearer_key_is_sent_when_configured() -> None:
    with FakeOpenAIServer(api_key=SECRET) as fake, ServerClient(fake.url, api_key=SECRET) as http:
        assert http.models() == [MODEL]
        assert http.chat([{"role": "user", "content": "hi"}], MODEL).content == "READY"


@pytest.mark.parametrize("stream", [False, True])
def test_wrong_key_is_reported_without_leaking_it(stream: bool) -> None:
    with (
        FakeOpenAIServer(api_key="the-right-key") as fake,
        ServerClient(fake.url, api_key=SECRET) as http,
    ):
        with pytest.raises(ApiKeyRejected) as caught:
            http.chat([{"role": "user", "content": "hi"}], MODEL, stream=stream)
        assert SECRET not in repr(http)
    error = caught.value
    assert error.message == (
        f"the server at {fake.url} rejected the API key (HTTP 401 on /v1/chat/completions)"
    )
    assert error.hint == "use the API key stored in the deployment's state directory"
    for text in (str(error), repr(error), error.message, error.hint or ""):
        assert SECRET not in text


def test_missing_key_says_one_is_required() -> None:
    with (
        FakeOpenAIServer(api_key=SECRET) as fake,
        ServerClient(fake.url) as http,
        pytest.raises(ApiKeyRejected, match="requires an API key"),
    ):
        http.models()


def test_errors_are_sm120_errors_and_mask_the_key_in_server_text() -> None:
    with FakeOpenAIServer() as fake, ServerClient(fake.url, api_key=SECRET) as http:
        fake.script(Reply(status=400, error_message=f"bad request from key {SECRET}"))
        with pytest.raises(BadServerResponse) as caught:
            http.chat([{"role": "user", "content": "hi"}], MODEL)
    assert isinstance(caught.value, SM120Error)
    expected = "/v1/chat/completions answered HTTP 400: bad request from key ***"
    assert caught.value.message == expected


def test_smoke_test_passes_on_content(server: FakeOpenAIServer, client: ServerClient) -> None:
    result = smoke_test(client, MODEL, thinking=False)
    assert result.ok
    assert result.content == "READY"
    assert result.failure_id is None
    assert result.message == "answered: READY"
    sent = server.chat_requests[0]
    assert sent["messages"] == [{"role": "user", "content": "Reply with exactly: READY"}]
    assert sent["max_tokens"] == 64
    assert sent["temperature"] == 0.0
    assert sent["chat_template_kwargs"]["enable_thinking"] is False


def test_smoke_test_flags_reasoning_that_ate_the_budget(
    server: FakeOpenAIServer, client: ServerClient
) -> None:
    server.script(Reply(content="", reasoning="Let me think about this", finish_reason="length"))
    result = smoke_test(client, MODEL, thinking=True)
    assert not result.ok
    assert result.failure_id == "F12"
    assert result.reasoning == "Let me think about this"
    assert result.finish_reason == "length"
    assert "max_tokens budget (64)" in result.message
    assert "2000" in result.message
    assert "thinking off" in result.message


def test_smoke_test_flags_length_even_without_reasoning(
    server: FakeOpenAIServer, client: ServerClient
) -> None:
    server.script(Reply(content="", finish_reason="length"))
    result = smoke_test(client, MODEL, thinking=False, max_tokens=8)
    assert (result.ok, result.failure_id) == (False, "F12")


def test_smoke_test_rejects_empty_content(server: FakeOpenAIServer, client: ServerClient) -> None:
    server.script(Reply(content="   ", finish_reason="stop"))
    result = smoke_test(client, MODEL, thinking=False)
    assert not result.ok
    assert result.failure_id is None
    assert result.message == "the server answered with no text (finish_reason=stop)"


def test_smoke_test_explains_reasoning_without_an_answer(
    server: FakeOpenAIServer, client: ServerClient
) -> None:
    server.script(Reply(content="", reasoning="thinking forever", finish_reason="stop"))
    result = smoke_test(client, MODEL, thinking=True)
    assert not result.ok
    assert result.failure_id is None
    assert "all output went to reasoning" in result.message


def test_client_repr_never_shows_the_key() -> None:
    http = ServerClient("http://127.0.0.1:9", api_key=SECRET)
    try:
        assert repr(http) == "ServerClient(base_url='http://127.0.0.1:9', api_key=<set>)"
    finally:
        http.close()
