"""`sm120 doctor` right after the quickstart: the port its own deployment serves is that
deployment (info), not a FAIL; a port held by anything else still fails."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator

import pytest

from sm120.core.ports import ensure_port_free
from sm120.doctor import host_checks
from sm120.doctor.run import _deployment_on_port
from sm120.engine.runtime.processes import start_ticks
from sm120.engine.state import deployment_dir
from tests.deploy.test_stop_safety import state_document, write_state
from tests.helpers import wait_for


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.fixture
def supervisor() -> Iterator[subprocess.Popen[bytes]]:
    """Stands for a deployment's supervisor: alive, leading its own session."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    wait_for(lambda: start_ticks(process.pid) is not None)
    yield process
    process.kill()
    process.wait()


def test_a_port_held_by_an_own_deployment_is_named_not_failed(held_port: int) -> None:
    (finding,) = host_checks.check_port(
        "127.0.0.1", held_port, ensure_port_free, lambda port: "tiny" if port == held_port else None
    )
    assert finding.severity == "info" and not finding.blocking
    assert (
        finding.message == f"port {held_port} on 127.0.0.1 is served by the sm120 deployment 'tiny'"
    )
    assert finding.remediation == "a second deployment needs --port; 'sm120 stop tiny' frees it"


def test_a_port_held_by_a_stranger_still_fails(held_port: int) -> None:
    (finding,) = host_checks.check_port("127.0.0.1", held_port, ensure_port_free, lambda _p: None)
    assert finding.severity == "error"


def test_the_running_deployment_on_a_port_is_found_from_its_state(
    supervisor: subprocess.Popen[bytes],
) -> None:
    ticks = start_ticks(supervisor.pid)
    write_state(state_document(deployment_dir("demo"), supervisor_pid=supervisor.pid,
                               supervisor_start=ticks, port=18123))  # fmt: skip
    assert _deployment_on_port(18123) == "demo"
    assert _deployment_on_port(18124) is None
    supervisor.kill()
    supervisor.wait()
    assert _deployment_on_port(18123) is None
