"""sm120.deploy.status: /health is read through the server client, with the deployment's key,
and a server that does not answer is None, not an error."""

from __future__ import annotations

from sm120.deploy import status
from tests.fakes.openai_server import FakeOpenAIServer
from tests.helpers import free_port

SECRET = "sk-status-7c1e-do-not-leak"


def test_health_is_the_status_the_server_answers_with_the_key() -> None:
    with FakeOpenAIServer(health_status=503) as fake:
        assert status._health(fake.url, SECRET) == 503
    assert fake.authorizations == [f"Bearer {SECRET}"]


def test_health_without_a_key_sends_no_authorization() -> None:
    with FakeOpenAIServer() as fake:
        assert status._health(fake.url, None) == 200
    assert fake.authorizations == [None]


def test_health_of_nothing_listening_is_none() -> None:
    assert status._health(f"http://127.0.0.1:{free_port()}", SECRET) is None
