"""Bind addresses: checked before anything starts, bracketed in URLs, warned about when they
reach beyond this machine."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.core.errors import SM120Error
from sm120.core.net import check_host, client_url, exposure_warning, http_url
from sm120.core.ports import AddressUnusable, PortInUse, ensure_port_free
from sm120.engine.secrets import ensure_api_key, read_api_key
from tests.helpers import invoke

HINT = "(hint: use 127.0.0.1 (this machine only, the default) or 0.0.0.0 (every interface))"


@pytest.mark.parametrize(
    ("host", "port", "path", "url"),
    [
        ("127.0.0.1", 8000, "/v1", "http://127.0.0.1:8000/v1"),
        ("::1", 8102, "/v1", "http://[::1]:8102/v1"),
        ("fe80::1", 80, "", "http://[fe80::1]:80"),
        ("gpu-box.lan", 8000, "/health", "http://gpu-box.lan:8000/health"),
    ],
)
def test_urls_bracket_ipv6(host: str, port: int, path: str, url: str) -> None:
    assert http_url(host, port, path) == url


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("::", "http://[::1]:8000"),
        ("::1", "http://[::1]:8000"),
        ("10.0.0.5", "http://10.0.0.5:8000"),
    ],
)
def test_a_server_on_every_interface_is_reached_over_loopback(host: str, url: str) -> None:
    assert client_url(host, 8000) == url


@pytest.mark.parametrize(
    ("given", "kept"),
    [("127.0.0.1", "127.0.0.1"), ("[::1]", "::1"), ("::", "::"), ("localhost", "localhost")],
)
def test_good_hosts_are_kept(given: str, kept: str) -> None:
    assert check_host(given) == kept


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("", "Error: --host is empty"),
        ("a b", "Error: --host 'a b' is not an IP address or host name"),
        ("http://x", "Error: --host 'http://x' is not an IP address or host name"),
        ("-x", "Error: --host '-x' is not an IP address or host name"),
        ("1.2.3.4:80", "Error: --host '1.2.3.4:80' is not an IP address or host name"),
        ("x" * 300, f"Error: --host '{'x' * 57}...' is not an IP address or host name"),
    ],
)
def test_bad_hosts_are_one_line_before_anything_starts(
    cli: CliRunner, host: str, message: str
) -> None:
    assert invoke(cli, "launch", "tiny", "--dry-run", "--host", host) == (
        2,
        "",
        f"{message} {HINT}\n",
    )


def test_a_bad_host_from_the_environment_names_its_variable(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SM120_HOST", "two words")
    assert invoke(cli, "launch", "tiny", "--dry-run") == (
        2,
        "",
        f"Error: SM120_HOST 'two words' is not an IP address or host name {HINT}\n",
    )


def test_a_bad_host_in_dotenv_names_its_key(cli: CliRunner, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("HOST=bad/host\n")
    assert invoke(cli, "launch", "tiny", "--dry-run") == (
        2,
        "",
        f"Error: HOST 'bad/host' is not an IP address or host name {HINT}\n",
    )


def test_the_dry_run_shows_an_ipv6_endpoint_in_brackets(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "launch", "tiny", "--dry-run", "--json", "--host", "::1")
    assert code == 0
    assert json.loads(out)["endpoint"].startswith("http://[::1]:")
    code, out, _ = invoke(cli, "launch", "tiny", "--dry-run", "--host", "[::1]", "--port", "8102")
    assert code == 0
    assert "endpoint  http://[::1]:8102/v1" in out


def test_binding_beyond_loopback_says_what_is_exposed() -> None:
    assert exposure_warning("127.0.0.1") is None
    assert exposure_warning("::1") is None
    assert exposure_warning("localhost") is None
    assert exposure_warning("0.0.0.0") == (
        "binding to 0.0.0.0: other machines can reach this server; /v1 needs the API key, "
        "but vLLM answers /invocations (a whole chat answer), /metrics, /tokenize and its other "
        "routes without one (README: Security)"
    )


def test_an_address_this_machine_lacks_is_not_called_a_busy_port() -> None:
    # TEST-NET-1 (RFC 5737) is never assigned to a machine.
    with pytest.raises(AddressUnusable) as caught:
        ensure_port_free("192.0.2.1", 8000)
    assert caught.value.one_line() == (
        "cannot bind 192.0.2.1 port 8000: Cannot assign requested address (hint: use an "
        "address of this machine (see 'ip addr'), e.g. 127.0.0.1 or 0.0.0.0)"
    )


def test_a_name_that_does_not_resolve_is_not_called_a_busy_port() -> None:
    with pytest.raises(AddressUnusable) as caught:
        ensure_port_free("no-such-host.invalid", 8000)
    assert caught.value.message.startswith("cannot bind no-such-host.invalid: the name does not")


@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
def test_a_busy_port_is_still_a_busy_port(family: socket.AddressFamily, host: str) -> None:
    with socket.socket(family) as holder:
        holder.bind((host, 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortInUse) as caught:
            ensure_port_free(host, port)
    assert (
        caught.value.message == f"port {port} on {host} is already in use (Address already in use)"
    )


# --- every deployment has a key --------------------------------------------------------------


@pytest.mark.parametrize("key", ["", " ", "two words", "tab\there", "bell\x07", "clé"])
def test_a_blank_or_spaced_api_key_is_refused(key: str) -> None:
    with pytest.raises(SM120Error) as caught:
        ensure_api_key("demo", key)
    assert caught.value.one_line() == (
        "--api-key must be printable ASCII text without spaces (hint: leave it out and a key is "
        "generated (stored 0600 beside the deployment))"
    )


def test_a_key_file_of_bytes_that_are_no_key_is_one_line() -> None:
    from sm120.engine.secrets import KeyFileError

    path = ensure_api_key("demo", None)
    path.write_bytes(b"\xff\xfe key")
    with pytest.raises(KeyFileError) as caught:
        read_api_key(str(path))
    assert caught.value.one_line() == (
        f"key file {path} holds bytes that are not a key (printable ASCII) (hint: delete it; "
        "launch writes a new key (or write the key you use into it))"
    )


def test_an_emptied_key_file_gets_a_new_key() -> None:
    path = ensure_api_key("demo", None)
    path.write_text("  \n")
    assert ensure_api_key("demo", None) == path
    key = read_api_key(str(path))
    assert key is not None and len(key) >= 32
