"""The gateway's access log: a line per request on both paths (the front's own pipe and the
application it hands over to), lifecycle events, no key, bounded and rotated."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.gateway import access_log
from sm120.gateway.access_log import AccessLog, RequestRecord
from sm120.gateway.server import LoggedActions
from tests.fakes.gateway import FakeActions, backend
from tests.gateway.test_gateway_front import CHAT, STREAM, Engine, gateway, read_answers, request
from tests.helpers import invoke

LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (?P<client>\S+) (?P<method>\S+) (?P<path>\S+) "
    r"model=(?P<model>\S+) deployment=(?P<deployment>\S+) status=(?P<status>\S+) "
    r"bytes=(?P<bytes>\d+) ttfb_ms=(?P<ttfb>\S+) ms=(?P<ms>[\d.]+) via=(?P<via>\S+)$"
)


def test_each_request_is_one_line_on_either_path_and_no_key_is_written(tmp_path: Path) -> None:
    log = AccessLog(tmp_path / "access.log")

    async def scenario() -> int:
        async with gateway(Engine(), access=log) as the_front:
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request(CHAT))
            (answer,) = await read_answers(reader, 1)
            local = writer.get_extra_info("sockname")[1]
            # A wrong key: handed to the application, which answers 401 and logs it.
            reader, writer = await asyncio.open_connection("127.0.0.1", the_front.port)
            writer.write(request({**CHAT, "model": "x\nforged line"}, key="sk-wrong-key-123456"))
            await read_answers(reader, 1)
            writer.close()
            await asyncio.sleep(access_log.FLUSH_EVERY_S + 0.3)  # the timer writes
            assert len(answer) > 0
            return int(local)

    local_port = asyncio.run(scenario())
    text = (tmp_path / "access.log").read_text()
    lines = text.splitlines()
    assert len(lines) == 2
    fast, refused = (LINE.match(line) for line in lines)
    assert fast is not None and refused is not None
    assert fast["client"] == f"127.0.0.1:{local_port}"
    assert (fast["method"], fast["path"], fast["model"], fast["deployment"]) == (
        "POST", "/v1/chat/completions", "sim", "dep-sim",
    )  # fmt: skip
    assert (fast["status"], int(fast["bytes"]), fast["via"]) == ("200", len(STREAM), "fast")
    assert float(fast["ttfb"]) <= float(fast["ms"])
    # The handed-over request names the real client, not the internal socket.
    assert refused["client"].startswith("127.0.0.1:") and refused["via"] == "app"
    assert (refused["status"], refused["model"]) == ("401", "-")
    assert int(refused["bytes"]) > 50  # the error body, written after the line's middleware
    assert "sk-wrong" not in text and "engine-key" not in text and "forged line" not in text


def test_a_model_name_cannot_break_or_forge_a_line() -> None:
    record = RequestRecord("1.2.3.4:5", "POST", "/v1/messages", "app")
    record.model = "claude\nevil status=200 " + "x" * 500
    line = record.line(record.started + 0.25)
    assert "\n" not in line
    assert line.count(" status=") == 1 and " status=- " in line  # the forged one is defused
    assert "model=claude?evil?status=200?xxx" in line and len(line) < 400


def test_events_are_lines_with_a_quoted_reason(tmp_path: Path) -> None:
    log = AccessLog(tmp_path / "access.log")
    log.event("refusal", reason='no room: "a" is busy\nnow', model="a", deployment="dep-a")
    log.event("start", port=18900)
    log.flush()
    first, second = (tmp_path / "access.log").read_text().splitlines()
    quoted = '"no room: \\"a\\" is busy\\nnow"'
    assert first.endswith(f"event=refusal model=a deployment=dep-a reason={quoted}")
    assert second.endswith("event=start port=18900")
    assert (tmp_path / "access.log").stat().st_mode & 0o777 == 0o600


def test_the_file_is_rotated_and_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access_log, "ROTATE_BYTES", 1000)
    log = AccessLog(tmp_path / "access.log")
    for index in range(200):
        log.event("start", port=index)
        log.flush()
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == ["access.log", "access.log.1", "access.log.2", "access.log.3"]
    assert all(path.stat().st_size <= 1000 for path in tmp_path.iterdir())
    assert (tmp_path / "access.log").read_text().splitlines()[-1].endswith("port=199")


def test_logs_gateway_shows_the_last_lines_and_says_when_there_is_none(
    cli: CliRunner, isolated_home: Path
) -> None:
    code, _, err = invoke(cli, "logs", "--gateway")
    assert code == 2
    assert err.strip() == (
        f"Error: no gateway access log at {isolated_home / 'gateway' / 'access.log'} "
        "(hint: the gateway writes it once it runs: sm120 gateway start)"
    )
    (isolated_home / "gateway").mkdir(parents=True)
    log = AccessLog(isolated_home / "gateway" / "access.log")
    for port in (1, 2, 3):
        log.event("start", port=port)
    log.flush()
    code, out, _ = invoke(cli, "logs", "--gateway", "-n", "2")
    assert code == 0
    assert [line.split(" ", 1)[1] for line in out.splitlines()] == [
        "event=start port=2", "event=start port=3"
    ]  # fmt: skip


def test_a_swap_is_logged_as_it_happens(tmp_path: Path) -> None:
    table = {
        "a": backend("a", "http://127.0.0.1:1"),
        "b": backend("b", "http://127.0.0.1:2", running=False),
    }
    log = AccessLog(tmp_path / "access.log")
    actions = LoggedActions(FakeActions(table), log)

    async def swap() -> None:
        await actions.stop(table["a"])
        await actions.start(table["b"], 1.0)

    asyncio.run(swap())
    log.flush()
    events = [line.split(" ", 1)[1] for line in (tmp_path / "access.log").read_text().splitlines()]
    assert events == [
        "event=swap action=stop deployment=dep-a",
        "event=swap action=start deployment=dep-b",
    ]
