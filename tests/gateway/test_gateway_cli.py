"""`sm120 gateway start|stop|status` with a real detached gateway process (no engine), and
every bad input tripping its one-line error."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from sm120.gateway.config import GatewayConfig
from sm120.gateway.control import GatewayError, check_config, stop_gateway
from sm120.gateway.files import gateway_files
from tests.helpers import free_port, invoke, one_line_error


@pytest.fixture
def gateway_port(isolated_home: Path) -> Iterator[int]:
    """A port for the gateway; whatever gateway a test started is stopped afterwards."""
    yield free_port()
    stop_gateway(gateway_files())


def test_start_status_stop_round_trip(cli: CliRunner, gateway_port: int) -> None:
    code, out, _ = invoke(cli, "gateway", "start", "--port", str(gateway_port))
    files = gateway_files()
    key = files.api_key.read_text().strip()
    assert code == 0
    assert out.startswith(f"gateway started on http://127.0.0.1:{gateway_port}/v1 (pid ")
    assert f"key in {files.api_key}" in out
    assert key not in out
    assert oct(files.api_key.stat().st_mode & 0o777) == "0o600"
    base = f"http://127.0.0.1:{gateway_port}"
    assert httpx.get(f"{base}/v1/models", timeout=5).status_code == 401
    listed = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=5)
    assert listed.json() == {"object": "list", "data": []}

    code, out, _ = invoke(cli, "gateway", "start", "--port", str(gateway_port))
    assert code == 0 and out.startswith("gateway already running on ")

    code, out, _ = invoke(cli, "gateway", "status", "--json")
    row = json.loads(out)
    assert row["running"] is True and row["endpoint"] == f"{base}/v1"
    pid = row["pid"]

    code, out, _ = invoke(cli, "status")
    assert out.splitlines()[-1].startswith(f"gateway   {base}/v1  pid {pid}")
    code, out, _ = invoke(cli, "status", "--json")
    assert json.loads(out)[-1]["kind"] == "gateway"

    code, out, _ = invoke(cli, "gateway", "stop")
    assert (code, out) == (0, f"stopped the gateway (pid {pid})\n")
    assert _ends_soon(pid)
    code, out, _ = invoke(cli, "gateway", "stop")
    assert (code, out) == (0, "no gateway was running\n")
    code, out, _ = invoke(cli, "gateway", "status")
    assert out == "gateway   not running (start it: sm120 gateway start)\n"
    code, out, _ = invoke(cli, "status", "--json")
    assert json.loads(out) == []


def _ends_soon(pid: int) -> bool:
    """The process is gone (or a zombie of our test process) within a few seconds: it lets
    go of its lock a moment before it exits."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
            return True
        time.sleep(0.05)
    return False


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def test_the_key_survives_a_restart(cli: CliRunner, gateway_port: int) -> None:
    invoke(cli, "gateway", "start", "--port", str(gateway_port))
    first = gateway_files().api_key.read_text()
    invoke(cli, "gateway", "stop")
    invoke(cli, "gateway", "start", "--port", str(gateway_port))
    assert gateway_files().api_key.read_text() == first


def test_a_second_gateway_on_another_port_is_refused(cli: CliRunner, gateway_port: int) -> None:
    invoke(cli, "gateway", "start", "--port", str(gateway_port))
    other = free_port()
    code, _, err = invoke(cli, "gateway", "start", "--port", str(other))
    assert code == 2
    assert one_line_error(err).startswith(
        f"Error: a gateway already runs on 127.0.0.1:{gateway_port} (pid "
    )
    assert one_line_error(err).endswith("(hint: stop it first: sm120 gateway stop)")


def test_stop_never_signals_a_process_it_did_not_start(cli: CliRunner, isolated_home: Path) -> None:
    """A pid file left behind (not locked) names some other process: it is left alone."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        files = gateway_files()
        files.pid.write_text(f"{bystander.pid}\n")
        code, out, _ = invoke(cli, "gateway", "stop")
        assert (code, out) == (0, "no gateway was running\n")
        time.sleep(0.2)
        assert bystander.poll() is None
    finally:
        bystander.send_signal(signal.SIGTERM)
        bystander.wait()


def test_a_taken_port_fails_before_anything_starts(cli: CliRunner, isolated_home: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, _, err = invoke(cli, "gateway", "start", "--port", str(port))
    assert code == 2
    assert one_line_error(err) == (
        f"Error: port {port} on 127.0.0.1 is already in use (Address already in use) (hint: "
        "pick another with --port, or 'sm120 status' / 'sm120 stop' if it is ours)"
    )
    assert not gateway_files().pid.exists() or stop_gateway(gateway_files()) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--port", "0"),
            "Error: --port must be 1 or more, got 0 (hint: use a port from 1 to 65535, e.g. 8000)",
        ),
        (
            ("--port", "70000"),
            "Error: --port must be 65535 or less, got 70000 "
            "(hint: use a port from 1 to 65535, e.g. 8000)",
        ),
        (
            ("--host", "not a host"),
            "Error: --host 'not a host' is not an IP address or host name "
            "(hint: use 127.0.0.1 (this machine only, the default) or 0.0.0.0 (every interface))",
        ),
        (
            ("--max-awake", "-1"),
            "Error: --max-awake must be 0 or more, got -1 "
            "(hint: how many deployments fit at once; 0 never swaps)",
        ),
        (
            ("--swap-wait", "0"),
            "Error: --swap-wait must be 1 or more, got 0 "
            "(hint: seconds a request waits for a swap, e.g. --swap-wait 600)",
        ),
        (
            ("--busy-share", "0"),
            "Error: --busy-share must be more than 0, got 0 "
            "(hint: the part of an engine's slots one key may hold, e.g. --busy-share 0.5)",
        ),
        (
            ("--busy-share", "1.5"),
            "Error: --busy-share must be 1 or less, got 1.5 "
            "(hint: the part of an engine's slots one key may hold, e.g. --busy-share 0.5)",
        ),
        (
            ("--first-token-hold", "31"),
            "Error: --first-token-hold must be 30 or less, got 31 "
            "(hint: seconds, e.g. --first-token-hold 1 (0: off))",
        ),
        (
            ("--host", "192.0.2.1"),
            "Error: cannot bind 192.0.2.1 port 8808: Cannot assign requested address "
            "(hint: use an address of this machine (see 'ip addr'), e.g. 127.0.0.1 or 0.0.0.0)",
        ),
    ],
)
def test_bad_start_options(
    cli: CliRunner, isolated_home: Path, args: tuple[str, ...], message: str
) -> None:
    code, out, err = invoke(cli, "gateway", "start", *args)
    assert (code, out, one_line_error(err)) == (2, "", message)
    assert not gateway_files().address.exists()


def test_the_library_refuses_a_negative_max_awake_too() -> None:
    with pytest.raises(GatewayError, match=r"^--max-awake must be 0 or more$"):
        check_config(GatewayConfig(max_awake=-1))


def test_the_gateway_process_refuses_a_second_copy(gateway_port: int, cli: CliRunner) -> None:
    invoke(cli, "gateway", "start", "--port", str(gateway_port))
    second = subprocess.run(
        [sys.executable, "-m", "sm120.gateway", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
        check=False,
    )
    assert second.returncode == 2
    assert second.stderr.startswith("Error: a gateway already runs (pid ")


def test_foreground_serves_until_sigterm(gateway_port: int, isolated_home: Path) -> None:
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sm120",
            "gateway",
            "start",
            "--foreground",
            "--port",
            str(gateway_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{gateway_port}/health", timeout=1).status_code:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert gateway_files().address.exists()
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0
    assert err.startswith(f"gateway serving http://127.0.0.1:{gateway_port}/v1; clients send")
    assert gateway_files().api_key.read_text().strip() not in err
    assert not gateway_files().address.exists()


def test_a_start_with_other_aliases_is_refused_and_a_bad_alias_is_one_line(
    cli: CliRunner, gateway_port: int
) -> None:
    code, _, err = invoke(
        cli, "gateway", "start", "--port", str(gateway_port), "--alias", "claude-*=tiny"
    )
    assert code == 0, err
    pid = gateway_files().pid.read_text().strip()
    code, out, err = invoke(
        cli, "gateway", "start", "--port", str(gateway_port), "--alias", "claude-*=glm52"
    )
    assert (code, out) == (2, "")
    assert one_line_error(err) == (
        f"Error: a gateway already runs (pid {pid}) with other aliases: claude-*=tiny "
        "(hint: stop it first (sm120 gateway stop), then start it with the aliases you want)"
    )
    code, out, _ = invoke(cli, "gateway", "status", "--json")
    assert json.loads(out)["aliases"] == {"claude-*": "tiny"}


def test_a_bad_alias_is_refused_before_anything_starts(cli: CliRunner, isolated_home: Path) -> None:
    code, out, err = invoke(cli, "gateway", "start", "--alias", "claude")
    assert (code, out) == (2, "")
    assert one_line_error(err).startswith("Error: alias 'claude' has no '='")
    assert not gateway_files().address.exists()
