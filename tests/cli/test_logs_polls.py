"""`sm120 logs` shows the engine's own lines; the monitor's /health and /metrics polls only
with --polls (on an idle server they were 18 of the last 20 lines)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from sm120.logs.polls import is_poll_line
from tests.cli.test_bad_input import _deployment_at
from tests.helpers import DATA_DIR, invoke

HEALTH = '(APIServer pid=8857) INFO:     127.0.0.1:55704 - "GET /health HTTP/1.1" 200 OK'
METRICS = '(APIServer pid=8857) INFO:     127.0.0.1:55724 - "GET /metrics HTTP/1.1" 200 OK'
CHAT = (
    '(APIServer pid=8857) INFO:     127.0.0.1:55730 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
)


def test_only_health_and_metrics_gets_are_polls() -> None:
    assert is_poll_line(HEALTH) and is_poll_line(METRICS)
    assert not is_poll_line(CHAT)
    assert not is_poll_line("INFO 11-21 [api_server.py] Starting vLLM API server on /health")
    assert not is_poll_line('127.0.0.1 - "GET /v1/models HTTP/1.1" 200 OK')


def test_a_real_engine_log_has_polls_the_pattern_finds() -> None:
    log = (DATA_DIR / "gpu_proof" / "engine-v0.26.0-h200-tiny-gpu.log").read_text()
    polls = [line for line in log.splitlines() if "GET /health" in line or "GET /metrics" in line]
    assert polls and all(is_poll_line(line) for line in polls)


def write_log(home: Path) -> None:
    _deployment_at(home, 1)
    lines = ["engine line 1", HEALTH, METRICS, "engine line 2", *[HEALTH, METRICS] * 30, CHAT]
    log = home / "deployments" / "tiny" / "logs" / "serve.log"
    log.write_text("\n".join(lines) + "\n")


def test_logs_hide_the_monitors_polls(cli: CliRunner, isolated_home: Path) -> None:
    write_log(isolated_home)
    code, out, err = invoke(cli, "logs", "-n", "3")
    assert (code, err) == (0, "")
    assert out.splitlines() == ["engine line 1", "engine line 2", CHAT]


def test_logs_show_them_when_asked(cli: CliRunner, isolated_home: Path) -> None:
    write_log(isolated_home)
    code, out, _ = invoke(cli, "logs", "-n", "3", "--polls")
    assert (code, out.splitlines()) == (0, [HEALTH, METRICS, CHAT])
