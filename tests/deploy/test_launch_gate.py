"""`sm120 launch --gate`: validated before anything starts; a failed gate stops the server
unless --keep-on-fail (the real-engine path is in tests/integration/test_measure_realstack.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from sm120.deploy.gate import GateRequest, run_launch_gate
from sm120.engine.runtime.base import RuntimeStatus
from sm120.engine.state import DeploymentState, load_state, save_state
from sm120.measure.target import save_plan
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.helpers import invoke

KEY = "sk-gate-secret"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--gate", "cor"],
            "Error: no gate suite 'cor'; did you mean 'core'? "
            "(hint: suites: core, long, multiturn, tools)",
        ),
        (
            ["--keep-on-fail"],
            "Error: --keep-on-fail and --gate-max-tokens need --gate (hint: e.g. --gate core)",
        ),
        (
            ["--gate", "core", "--gate-max-tokens", "0"],
            "Error: --gate-max-tokens must be 1 or more, got 0 (hint: or leave it out)",
        ),
    ],
)
def test_gate_options_are_checked_first(cli: CliRunner, args: list[str], message: str) -> None:
    code, out, err = invoke(cli, "launch", "tiny", "--dry-run", *args)
    assert (code, out, err.strip()) == (2, "", message)


def test_a_valid_gate_leaves_the_dry_run_alone(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "launch", "tiny", "--dry-run", "--gate", "core,tools")
    assert code == 0 and "tiny" in out


class RecordingRuntime:
    def __init__(self) -> None:
        self.stopped: list[str] = []

    def status(self, state: DeploymentState) -> RuntimeStatus:
        return RuntimeStatus(running=True, exit=None, pid=None)

    def stop(self, state: DeploymentState, timeout: float = 30.0) -> None:
        self.stopped.append(state.name)


@pytest.fixture
def ready(isolated_home: Path) -> Iterator[tuple[SimpleNamespace, FakeOpenAIServer]]:
    with FakeOpenAIServer(api_key=KEY, model="tiny") as server:
        isolated_home.mkdir(parents=True, exist_ok=True)
        key_file = isolated_home / "key"
        key_file.write_text(KEY)
        state = DeploymentState(
            name="tiny",
            recipe="tiny",
            runtime="native",
            supervisor_pid=4_194_304,  # PID_MAX_LIMIT itself: never a live process
            engine_pid=None,
            host="127.0.0.1",
            port=int(server.url.rsplit(":", 1)[1]),
            plan_hash="h",
            started_at=0.0,
            log_path=str(isolated_home / "serve.log"),
            exit_file=str(isolated_home / "exit.json"),
            served_model_name="tiny",
            model_dir=None,
            api_key_file=str(key_file),
        )
        save_state(state)
        save_plan("tiny", {"plan_hash": "h", "argv": [], "thinking": False})
        yield SimpleNamespace(state=state), server


def test_passing_gate(
    ready: tuple[SimpleNamespace, FakeOpenAIServer], capsys: pytest.CaptureFixture[str]
) -> None:
    launched, server = ready
    for pattern, content in [
        ("youngest", "Cleo"), ("bloops", "Yes."), ("17 multiplied", "391"),
        ("train travels", "40"), ("91 a prime", "No: 7 x 13."),
        ("is_palindrome", "```\ndef is_palindrome(s):\n    return s == s[::-1]\n```"),
        ("Theseus", "A ship whose planks are all replaced."),
        ("asterisks", "```\n*\n**\n***\n****\n```"), ("remember", "OK"),
        ("How old", "Pixel will be 10."),
    ]:  # fmt: skip
        server.when(pattern, Reply(content=content))
    runtime = RecordingRuntime()
    code = run_launch_gate(launched, runtime, GateRequest(("core",)))  # type: ignore[arg-type]
    assert code == 0
    assert runtime.stopped == []
    err = capsys.readouterr().err
    assert "gate: running core before announcing READY" in err
    assert "core: 9/9 cases passed - passed" in err


def test_failing_gate_stops_the_server(
    ready: tuple[SimpleNamespace, FakeOpenAIServer], capsys: pytest.CaptureFixture[str]
) -> None:
    launched, _server = ready
    runtime = RecordingRuntime()
    code = run_launch_gate(launched, runtime, GateRequest(("core",), max_tokens=8))  # type: ignore[arg-type]
    assert code == 1
    assert runtime.stopped == ["tiny"]
    assert load_state("tiny") is None
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "Error: the gate failed (core 9 of 9 cases failed); the server was stopped (hint: the "
        "failed cases are listed above; --keep-on-fail keeps it running to investigate)"
    )


def test_keep_on_fail_keeps_it(
    ready: tuple[SimpleNamespace, FakeOpenAIServer], capsys: pytest.CaptureFixture[str]
) -> None:
    launched, _server = ready
    runtime = RecordingRuntime()
    request = GateRequest(("tools",), keep_on_fail=True)
    assert run_launch_gate(launched, runtime, request) == 1  # type: ignore[arg-type]
    assert runtime.stopped == []
    assert load_state("tiny") is not None
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "Error: the gate failed (tools 2 of 2 cases failed); the server keeps running "
            "(--keep-on-fail)"
        )
    )


def test_gate_that_cannot_reach_the_server(
    ready: tuple[SimpleNamespace, FakeOpenAIServer], capsys: pytest.CaptureFixture[str]
) -> None:
    launched, server = ready
    server.stop()
    runtime = RecordingRuntime()
    assert run_launch_gate(launched, runtime, GateRequest(("core",))) == 1  # type: ignore[arg-type]
    assert runtime.stopped == ["tiny"]
    assert "Error: the core gate could not run: server not reachable at" in capsys.readouterr().err


def test_failing_gate_stops_the_monitor_before_the_server(
    ready: tuple[SimpleNamespace, FakeOpenAIServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop sequence of `sm120 stop`: a monitor still watching would restart the server
    the gate just stopped."""
    launched, _server = ready
    steps: list[str] = []
    monkeypatch.setattr("sm120.deploy.stop.stop_for", lambda name: steps.append(f"monitor {name}"))

    class OrderedRuntime(RecordingRuntime):
        def stop(self, state: DeploymentState, timeout: float = 30.0) -> None:
            steps.append(f"runtime {state.name} (state kept: {load_state(state.name) is not None})")

    code = run_launch_gate(launched, OrderedRuntime(), GateRequest(("core",), max_tokens=8))  # type: ignore[arg-type]
    assert code == 1
    assert steps == ["monitor tiny", "runtime tiny (state kept: True)"]
    assert load_state("tiny") is None
