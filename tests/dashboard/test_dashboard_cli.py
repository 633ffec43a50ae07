"""`sm120 dashboard`: serves alone until SIGTERM, behind the gateway key, and refuses to start
beside a running gateway (which serves the dashboard itself)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from sm120.gateway.control import stop_gateway
from sm120.gateway.files import gateway_files
from tests.helpers import free_port, invoke, one_line_error, wait_for


@pytest.fixture
def gateway_port(isolated_home: Path) -> Iterator[int]:
    yield free_port()
    stop_gateway(gateway_files())


def test_a_running_gateway_serves_it_and_sm120_dashboard_points_there(
    cli: CliRunner, gateway_port: int
) -> None:
    assert invoke(cli, "gateway", "start", "--port", str(gateway_port))[0] == 0
    page = f"http://127.0.0.1:{gateway_port}/dashboard"
    assert httpx.get(page, timeout=5).status_code == 401
    code, _, err = invoke(cli, "dashboard")
    assert code == 2
    assert one_line_error(err) == (
        f"Error: the gateway serves the dashboard already (hint: open {page} "
        "(sm120 gateway status))"
    )


def test_alone_it_serves_the_page_until_sigterm(isolated_home: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "sm120", "dashboard", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    page = f"http://127.0.0.1:{port}/dashboard"
    try:

        def answers() -> bool:
            try:
                return httpx.get(page, timeout=1).status_code == 401
            except httpx.HTTPError:
                return False

        wait_for(answers, timeout=30)
        key = gateway_files().api_key.read_text().strip()
        snapshot = httpx.get(
            f"{page}/api/snapshot", headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        assert snapshot.status_code == 200 and snapshot.json()["deployments"] == []
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0
    assert err.startswith(f"dashboard at {page}; sign in with the key in {gateway_files().api_key}")
    assert key not in err


def test_a_taken_port_is_refused_at_once(cli: CliRunner, isolated_home: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, _, err = invoke(cli, "dashboard", "--port", str(port))
    assert code == 2
    assert one_line_error(err).startswith(f"Error: port {port} on 127.0.0.1 is already in use")
