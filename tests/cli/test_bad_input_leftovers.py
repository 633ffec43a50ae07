"""Issue #49's leftovers: a deployment folder linked out of the state tree, a home that is a
file, key files that hold no key, ssh options and build arguments from every request. Each
case asserts the exact one line (or, where a command goes on, the exact row)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import invoke, one_line_error

# --- a deployment folder linked out of the state tree ---------------------------------------


def _linked_and_healthy(home: Path, outside: Path) -> Path:
    """`good` a stopped deployment of the tree's own, `demo` a link to `outside`, whose state
    file is not even JSON: a reader that followed the link would fail on it."""
    from tests.deploy.test_stop_safety import state_document

    good = home / "deployments" / "good"
    good.mkdir(parents=True)
    document = state_document(good, name="good", supervisor_pid=4_194_303)
    (good / "state.json").write_text(json.dumps(document))
    outside.mkdir()
    (outside / "state.json").write_text("{not json")
    (outside / "api_key").write_bytes(b"\xff")
    link = home / "deployments" / "demo"
    link.symlink_to(outside)
    return link


def _link_line(link: Path, outside: Path, home: Path) -> str:
    return (
        f"{link} is a link to {outside}, outside sm120's state folder {home} "
        f"(hint: remove the link (rm {link}); sm120 makes its own folders there)"
    )


def test_status_names_a_linked_folder_and_shows_the_rest(
    cli: CliRunner, isolated_home: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    link = _linked_and_healthy(isolated_home, outside)
    code, out, err = invoke(cli, "status")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("good  (tiny, native runtime")
    assert lines[-2:] == [
        "demo  (not read)",
        f"  skipped   {_link_line(link, outside, isolated_home)}",
    ]
    code, out, _ = invoke(cli, "status", "--json")
    rows = json.loads(out)
    assert [row["name"] for row in rows] == ["good", "demo"]
    assert rows[1] == {"name": "demo", "skipped": _link_line(link, outside, isolated_home)}


@pytest.mark.parametrize(
    "args",
    [("stop", "demo"), ("logs", "--name", "demo"), ("status", "demo"),
     ("monitor", "--name", "demo"), ("chat", "--name", "demo", "hi"), ("logs",), ("stop",)],
)  # fmt: skip
def test_commands_on_a_linked_folder_refuse_in_one_line(
    cli: CliRunner, isolated_home: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    outside = tmp_path / "outside"
    link = _linked_and_healthy(isolated_home, outside)
    code, out, err = invoke(cli, *args)
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: {_link_line(link, outside, isolated_home)}",
    )
    assert sorted(p.name for p in outside.iterdir()) == ["api_key", "state.json"]


def test_the_gateway_and_the_dashboard_name_a_linked_folder(
    isolated_home: Path, tmp_path: Path
) -> None:
    from sm120.dashboard.snapshot import snapshot
    from sm120.gateway.backends import discover

    outside = tmp_path / "outside"
    link = _linked_and_healthy(isolated_home, outside)
    skipped: dict[str, str] = {}
    discover(skipped)
    assert skipped == {"demo": f"StateError: {_link_line(link, outside, isolated_home)}"[:200]}
    shown = snapshot({}, None, lambda state: {"name": state.name})
    rows = {row["name"]: row for row in shown["deployments"]}
    assert rows["demo"]["phase"] == "unreadable"
    assert rows["demo"]["error"] == _link_line(link, outside, isolated_home)


# --- a home that is a file ------------------------------------------------------------------

_HOME_HINT = "(hint: point SM120_HOME at a folder (or unset it for ~/.local/state/sm120))"


@pytest.mark.parametrize(
    "args",
    [("status",), ("status", "--json"), ("logs",), ("logs", "--gateway"), ("stop", "demo"),
     ("stop",), ("gateway", "status"), ("gateway", "stop"), ("gateway", "keys", "list"),
     ("gateway", "start", "--port", "1"), ("gateway", "analyze"), ("dashboard", "--port", "1"),
     ("connect", "codex"), ("monitor", "--once"), ("launch", "tiny", "--dry-run")],
)  # fmt: skip
def test_a_home_that_is_a_file_is_refused_by_every_command(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    home = tmp_path / "home-file"
    home.write_text("")
    monkeypatch.setenv("SM120_HOME", str(home))
    code, out, err = invoke(cli, *args)
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: SM120_HOME {home} is a file, not a folder {_HOME_HINT}",
    )
    assert home.read_text() == ""


def test_the_default_home_that_is_a_file_is_refused_too(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SM120_HOME")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (tmp_path / "sm120").write_text("")
    code, out, err = invoke(cli, "status")
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: sm120's state folder {tmp_path / 'sm120'} is a file, not a folder "
        f"(hint: move the file {tmp_path / 'sm120'} aside; sm120 makes its folder there)",
    )


# --- key files that hold no key -------------------------------------------------------------

_NOT_ASCII = b"ab\xff\xfe\x80cd"


def _gateway_folder(home: Path) -> Path:
    folder = home / "gateway"
    folder.mkdir(parents=True, mode=0o700)
    return folder


def test_a_gateway_key_of_other_bytes_stops_the_start_and_is_kept(
    cli: CliRunner, isolated_home: Path
) -> None:
    key = _gateway_folder(isolated_home) / "api_key"
    key.write_bytes(_NOT_ASCII)
    code, out, err = invoke(cli, "gateway", "start", "--port", "1")
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: key file {key} holds bytes that are not a key (printable ASCII) (hint: delete "
        "it; the next 'sm120 gateway start' writes a new key (point clients at it again: "
        "sm120 connect))",
    )
    assert key.read_bytes() == _NOT_ASCII
    assert not (isolated_home / "gateway" / "gateway.pid").exists()


def test_a_mounted_gateway_key_of_other_bytes_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    key = tmp_path / "gateway_key"
    key.write_bytes(_NOT_ASCII)
    run = subprocess.run(
        [sys.executable, "-m", "sm120.gateway", "--port", "1", "--key-file", str(key)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (run.returncode, run.stdout, one_line_error(run.stderr)) == (
        2,
        "",
        f"Error: key file {key} holds bytes that are not a key (printable ASCII) (hint: write "
        "the key into it: one line of printable ASCII)",
    )


@pytest.mark.parametrize("content", [_NOT_ASCII * 8, b"short", b"x" * 40 + b"\x00" + b"y" * 40])
def test_a_damaged_key_store_secret_is_refused_never_replaced(
    cli: CliRunner, isolated_home: Path, content: bytes
) -> None:
    secret = _gateway_folder(isolated_home) / "keys.secret"
    secret.write_bytes(content)
    for args in (("gateway", "keys", "add", "bob"), ("gateway", "keys", "rotate", "bob")):
        code, out, err = invoke(cli, *args)
        assert (code, out, one_line_error(err)) == (
            2,
            "",
            f"Error: the key store's secret {secret} is damaged (it must hold 32 to 4,096 "
            f"characters of printable ASCII) (hint: restore it from a backup, or remove it and "
            f"{secret.parent / 'keys.json'} and add the keys again (sm120 gateway keys add))",
        )
    assert secret.read_bytes() == content
    assert not (secret.parent / "keys.json").exists()


def test_keys_without_their_secret_are_named_by_keys_list(
    cli: CliRunner, isolated_home: Path
) -> None:
    code, _, err = invoke(cli, "gateway", "keys", "add", "bob")
    assert code == 0, err
    secret = isolated_home / "gateway" / "keys.secret"
    secret.unlink()
    code, out, err = invoke(cli, "gateway", "keys", "list")
    store = isolated_home / "gateway" / "keys.json"
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: the key store {store} holds keys but their secret {secret} is missing (hint: "
        f"restore it from a backup, or remove {store} and add the keys again)",
    )


def test_a_key_store_of_other_bytes_is_one_line(cli: CliRunner, isolated_home: Path) -> None:
    store = _gateway_folder(isolated_home) / "keys.json"
    store.write_bytes(b'{"version": 1, "keys": [{"name": "a\xff", "digest": "00"}]}')
    code, out, err = invoke(cli, "gateway", "keys", "list")
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: the key store {store} is not UTF-8 text (byte 35) (hint: remove {store} to "
        "start over)",
    )


def test_a_running_deployments_damaged_key_is_named_in_its_row(
    isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from sm120.cli.manage import _status_text
    from sm120.deploy import status
    from sm120.engine.state import DeploymentState
    from tests.deploy.test_stop_safety import state_document
    from tests.fakes.openai_server import FakeOpenAIServer

    key = isolated_home / "api_key"
    isolated_home.mkdir(exist_ok=True)
    key.write_bytes(_NOT_ASCII)
    running = SimpleNamespace(running=True, stale=False, pid=4242, exit=None)
    runtime = SimpleNamespace(status=lambda _state: running)
    monkeypatch.setattr(status, "runtime_for", lambda _state: runtime)
    with FakeOpenAIServer() as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        document = state_document(isolated_home, api_key_file=str(key), port=port)
        row = status.describe(DeploymentState.from_dict(document))
    assert row["health"] == 200
    problem = (
        f"key file {key} holds bytes that are not a key (printable ASCII) (hint: delete it; "
        "launch writes a new key (or write the key you use into it))"
    )
    assert row["key_problem"] == problem
    assert f"  key       {problem}" in _status_text(row).splitlines()


# --- ssh options and build arguments, whichever command builds the request ------------------

_SSH_REFUSAL = "--ssh-option {!r} is not Keyword=value"


@pytest.mark.parametrize("option", ["IdentityFile", "A=b\nc", "=x"])
def test_every_request_that_carries_ssh_options_checks_them(option: str) -> None:
    from sm120.core.errors import PlanError
    from sm120.deploy.cluster_start import ClusterRequest
    from sm120.deploy.session import LaunchRequest
    from sm120.engine.cluster.ssh_node import SshNode
    from sm120.plan.resolve import PlanRequest
    from sm120.render.multinode import NodeAddress

    builders: list[Callable[[], object]] = [
        lambda: LaunchRequest(plan=PlanRequest(recipe="tiny"), ssh_options=(option,)),
        lambda: ClusterRequest([NodeAddress("a", "a")], ssh_options=(option,)),
        lambda: SshNode("a", rank=0, python="python3", options=(option,)),
    ]
    for build in builders:
        with pytest.raises(PlanError) as caught:
            build()
        assert caught.value.message == _SSH_REFUSAL.format(option)


def test_a_cluster_record_with_an_edited_ssh_option_is_unusable(isolated_home: Path) -> None:
    from sm120.deploy.cluster_start import (
        ClusterRequest,
        ClusterStart,
        cluster_start_path,
        load_cluster_start,
        save_cluster_start,
    )
    from sm120.render.multinode import NodeAddress
    from tests.helpers import plan_for

    request = ClusterRequest([NodeAddress("a", "a")], ssh_options=("IdentityFile=k",))
    start = ClusterStart("demo", plan_for("tiny").plan, request, "python3", "/k", 60.0)
    save_cluster_start(start)
    path = cluster_start_path("demo")
    path.write_text(path.read_text().replace("IdentityFile=k", "IdentityFile"))
    from sm120.core.errors import SM120Error

    with pytest.raises(SM120Error) as caught:
        load_cluster_start("demo")
    assert caught.value.one_line() == (
        f"{path} is unusable: --ssh-option 'IdentityFile' is not Keyword=value "
        "(hint: launch demo again to write it anew)"
    )


@pytest.mark.parametrize(
    ("args", "problem"),
    [({"A": "x\ny"}, "A's value holds a control character (a newline, tab or NUL)"),
     ({"A B": "x"}, "'A B' is not a build argument name (letters, digits, '_')")],
)  # fmt: skip
def test_build_options_check_their_build_arguments(args: dict[str, str], problem: str) -> None:
    from sm120.core.errors import SM120Error
    from sm120.images.build import BuildOptions

    with pytest.raises(SM120Error) as caught:
        BuildOptions(build_args=args)
    assert caught.value.one_line() == (
        f"--build-arg {problem} (hint: e.g. --build-arg TORCH_INDEX_URL=)"
    )


# --- endless input: every reader has a bound in size and in time ----------------------------


def _piped_parse(writer: str, *flags: str) -> tuple[int, str, str, float]:
    """`python -c WRITER | sm120 logs parse - FLAGS` through a real pipe."""
    import subprocess
    import sys
    import time

    started = time.monotonic()
    source = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "sm120", "logs", "parse", "-", *flags],
            stdin=source.stdout,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        source.kill()
        source.wait()
    return run.returncode, run.stdout, run.stderr, time.monotonic() - started


_ENDLESS_LINES = (
    "import sys\nline = b'INFO engine.py: Avg prompt throughput: 1.0 tokens/s, no log\\n' * 512\n"
    "while True:\n    sys.stdout.buffer.write(line)\n"
)


def test_an_endless_pipe_ends_at_the_size_bound_in_one_line() -> None:
    code, _, err, seconds = _piped_parse(_ENDLESS_LINES, "--max-mib", "4")
    assert (code, one_line_error(err)) == (
        2,
        "Error: stdin carried more than 4 MiB (hint: raise --max-mib, or save the log to a "
        "file and parse that)",
    )
    assert seconds < 60


def test_a_silent_pipe_ends_at_the_time_bound() -> None:
    code, out, err, seconds = _piped_parse("import time\ntime.sleep(300)", "--timeout", "1.5")
    assert (code, out, err) == (0, "", "0 lines, 0 events (stopped after 1.5 s: --timeout)\n")
    assert seconds < 30


def test_a_live_pipe_is_followed_until_the_time_bound() -> None:
    writer = (
        "import sys, time\n"
        "sys.stdout.write('INFO 01-01 00:00:00 [loggers.py:123] Engine 000: Avg prompt "
        "throughput: 10.0 tokens/s, Avg generation throughput: 5.0 tokens/s, Running: 1 reqs, "
        "Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%\\n')\n"
        "sys.stdout.flush()\ntime.sleep(300)\n"
    )
    code, out, err, _ = _piped_parse(writer, "--timeout", "3", "--json")
    assert code == 0
    assert [json.loads(line)["kind"] for line in out.splitlines()] == ["stats"]
    assert err == "1 lines, 1 events (stopped after 3 s: --timeout)\n"


def test_a_gate_case_against_a_server_that_trickles_for_ever_ends_at_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time
    from http.server import BaseHTTPRequestHandler

    from sm120.measure import gates
    from sm120.measure.cases import builtin_gates, select
    from sm120.measure.target import target_for_url
    from tests.fakes.loopback_server import LoopbackServer

    piece = {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
    event = b"data: " + json.dumps(piece).encode() + b"\n\n"

    class Trickle(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/chat/completions":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                while True:  # never stalls, never reaches the 32 MiB cap
                    self.wfile.write(event)
                    self.wfile.flush()
                    time.sleep(0.05)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *_args: object) -> None:
            pass

    monkeypatch.setattr(gates, "GATE_TURN_S", 1.5)
    case = select(builtin_gates(), "core")[0]
    started = time.monotonic()
    with LoopbackServer(Trickle) as server:
        report = gates.run_cases(target_for_url(server.url, None), "core", [case],
                                 gates.GateOptions())  # fmt: skip
    failures = report["cases"][0]["failures"]
    assert failures == [
        "turn 1: request failed: /v1/chat/completions was still streaming after 1.5 s"
    ]
    assert time.monotonic() - started < 20


def test_an_endless_message_stream_reaches_the_byte_bound_in_linear_time() -> None:
    import time
    from http.server import BaseHTTPRequestHandler

    from sm120.server.wire import Wire
    from tests.fakes.loopback_server import LoopbackServer

    delta = {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": "x" * 256}}  # fmt: skip
    event = b"event: content_block_delta\ndata: " + json.dumps(delta).encode() + b"\n\n"

    class Endless(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(event * 64)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *_args: object) -> None:
            pass

    started = time.monotonic()
    with LoopbackServer(Endless) as server, Wire(server.url, None, timeout=30) as wire:
        exchange = wire.messages([{"role": "user", "content": "hi"}], "tiny", max_tokens=16)
    assert exchange.error == "/v1/messages streamed more than 32 MiB"
    assert len(exchange.content) > 20 << 20
    assert time.monotonic() - started < 60
