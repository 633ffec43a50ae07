"""The gateway's static mode (what a compose project runs): backends and keys from files, the
file's refusals word for word, and `python -m sm120.gateway --backends` routing for real in
front of scripted backends."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sm120.gateway.static import (
    StaticBackend,
    StaticBackendsError,
    backends_document,
    load_static_backends,
)
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.helpers import free_port

HINT = 'write {"backends": [{"model", "service", "url", "key_file"}, ...]}'


def _key(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text + "\n")
    return str(path)


def test_a_written_file_loads_with_its_keys(tmp_path: Path) -> None:
    rows = [
        StaticBackend("a", "svc-a", "http://a:8000/", _key(tmp_path, "a_key", "key-a")),
        StaticBackend("b", "svc-b", "http://b:8001", _key(tmp_path, "b_key", "key-b")),
    ]
    file = tmp_path / "backends.json"
    file.write_text(backends_document(rows))
    found = load_static_backends(file)
    assert sorted(found) == ["a", "b"]
    a = found["a"]
    assert (a.deployment, a.base_url, a.api_key) == ("svc-a", "http://a:8000", "key-a")
    # compose owns these containers: the gateway takes them as up and never swaps them.
    assert (a.running, a.startable, a.sleep_mode) == (True, False, False)
    assert "key-a" not in repr(a)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read backends file {file}: No such file or directory"),
        (
            "{nope",
            "backends file {file} is not JSON: Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1)",
        ),
        ('{"backends": []}', "backends file {file} lists no backends"),
        (
            '{"backends": [{"model": "a"}]}',
            "backends file {file}: each backend needs model, service, url, key_file as text",
        ),
    ],
)
def test_unusable_files_are_refused(tmp_path: Path, text: str | None, message: str) -> None:
    file = tmp_path / "backends.json"
    if text is not None:
        file.write_text(text)
    with pytest.raises(StaticBackendsError) as caught:
        load_static_backends(file)
    assert caught.value.one_line() == f"{message.format(file=file)} (hint: {HINT})"


def test_a_model_listed_twice_is_refused(tmp_path: Path) -> None:
    key = _key(tmp_path, "k", "key")
    file = tmp_path / "backends.json"
    file.write_text(backends_document([StaticBackend("a", "one", "http://x", key)] * 2))
    with pytest.raises(StaticBackendsError) as caught:
        load_static_backends(file)
    assert caught.value.one_line() == (f"backends file {file} lists model 'a' twice (hint: {HINT})")


def test_a_missing_key_file_is_refused_at_start(tmp_path: Path) -> None:
    file = tmp_path / "backends.json"
    missing = tmp_path / "nokey"
    file.write_text(backends_document([StaticBackend("a", "one", "http://x", str(missing))]))
    with pytest.raises(StaticBackendsError) as caught:
        load_static_backends(file)
    assert caught.value.one_line() == (
        f"backend 'a': its key file {missing} is missing or empty "
        "(hint: mount the key file the backend serves with (sm120 compose writes secrets/))"
    )


def _gateway(tmp_path: Path, port: int, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sm120.gateway", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_static_mode_routes_each_model_with_its_own_key(tmp_path: Path) -> None:
    with (
        FakeOpenAIServer(api_key="key-a", model="a") as fake_a,
        FakeOpenAIServer(api_key="key-b", model="b") as fake_b,
    ):
        fake_a.default_reply = Reply(content="from a")
        fake_b.default_reply = Reply(content="from b")
        rows = [
            StaticBackend("a", "svc-a", fake_a.url, _key(tmp_path, "a_key", "key-a")),
            StaticBackend("b", "svc-b", fake_b.url, _key(tmp_path, "b_key", "key-b")),
        ]
        (tmp_path / "backends.json").write_text(backends_document(rows))
        gateway_key = _key(tmp_path, "gateway_key", "the-gateway-key")
        port = free_port()
        args = ("--backends", str(tmp_path / "backends.json"), "--key-file", gateway_key)
        process = _gateway(tmp_path, port, *args)
        try:
            with httpx.Client(
                base_url=f"http://127.0.0.1:{port}",
                headers={"Authorization": "Bearer the-gateway-key"},
                timeout=10,
            ) as client:
                _wait_for(client, process)
                answers = {}
                for model in ("a", "b"):
                    reply = client.post(
                        "/v1/chat/completions",
                        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                    )
                    assert reply.status_code == 200, reply.text
                    answers[model] = reply.json()["choices"][0]["message"]["content"]
                assert answers == {"a": "from a", "b": "from b"}
                listed = client.get("/v1/models").json()["data"]
                assert [(m["id"], m["deployment"], m["awake"]) for m in listed] == [
                    ("a", "svc-a", True),
                    ("b", "svc-b", True),
                ]
                wrong = client.get("/v1/models", headers={"Authorization": "Bearer key-a"})
                assert wrong.status_code == 401
        finally:
            process.terminate()
            process.wait(timeout=10)


def test_static_mode_without_its_key_file_exits_with_one_line(tmp_path: Path) -> None:
    key = _key(tmp_path, "a_key", "key-a")
    (tmp_path / "backends.json").write_text(
        backends_document([StaticBackend("a", "svc-a", "http://x", key)])
    )
    missing = tmp_path / "gateway_key"
    args = ("--backends", str(tmp_path / "backends.json"), "--key-file", str(missing))
    process = _gateway(tmp_path, free_port(), *args)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 2
    assert err == (
        f"Error: the gateway key file {missing} is missing or empty "
        "(hint: mount the key file (sm120 compose writes secrets/gateway_key))\n"
    )


def _wait_for(client: httpx.Client, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert process.poll() is None, process.communicate()[1]
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the gateway never answered /health"
        time.sleep(0.2)
