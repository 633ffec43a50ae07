"""The log parser on the output of a real vLLM (CPU build) serving the tiny model: the startup
facts, readiness and the periodic stats line after real requests."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sm120.logs.logparse import LogParser
from tests.helpers import free_port
from tests.integration.realstack import sm120

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def live_log(tmp_path_factory: pytest.TempPathFactory, engine_python: Path) -> Iterator[Path]:
    """serve.log of a real tiny server after two chat requests and one stats interval."""
    from sm120.engine.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(engine_python, tmp_path_factory.mktemp("models") / "tiny", print)
    home = tmp_path_factory.mktemp("home")
    port = free_port()
    try:
        launched = sm120(home, "launch", "tiny", "--port", str(port), "--model-dir", str(model))
        assert launched.returncode == 0, launched.stderr[-3000:]
        for prompt in ("hello", "tell me more"):
            chat = sm120(home, "chat", prompt, "--max-tokens", "16", timeout=300)
            assert chat.returncode == 0, chat.stderr[-2000:]
        log = home / "deployments" / "tiny" / "logs" / "serve.log"
        # vLLM logs stats every 10 s, and only while the engine has worked since the last line.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _generation_seen(log):
            time.sleep(2)
        yield log
    finally:
        sm120(home, "stop")


def _generation_seen(log: Path) -> bool:
    events = LogParser().feed_text(log.read_text(encoding="utf-8", errors="replace"))
    return any(
        event.kind == "stats" and (event.as_dict().get("gen_tps") or 0) > 0 for event in events
    )


def _parse_cli(log: Path) -> list[dict[str, Any]]:
    result = sm120(log.parents[3], "logs", "parse", str(log), "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_startup_facts_and_readiness(live_log: Path) -> None:
    events = _parse_cli(live_log)
    kinds = [event["kind"] for event in events]
    # 1 GiB of CPU KV cache / (2 layers x 2 KV heads x 64 x K and V x 2 bytes) = 1,048,576.
    assert {"kind": "kv_cache", "tokens": 1048576, "device": "CPU"} in events
    assert {"kind": "max_concurrency", "tokens_per_request": 1024, "x": 1024.0} in events
    assert kinds.count("ready") == 1
    assert kinds.index("kv_cache") < kinds.index("ready")
    (engine_init,) = [event for event in events if event["kind"] == "engine_init"]
    assert engine_init["seconds"] > 0


def test_stats_after_real_requests(live_log: Path) -> None:
    stats = [event for event in _parse_cli(live_log) if event["kind"] == "stats"]
    assert stats, "no periodic stats line within 120 s of the requests"
    for event in stats:
        assert event["engine"] == 0
        assert set(event) >= {"prompt_tps", "gen_tps", "running", "waiting", "kv_usage_pct"}
        assert 0.0 <= event["kv_usage_pct"] <= 100.0
    assert any(event["gen_tps"] > 0 and event["prompt_tps"] >= 0 for event in stats)


def test_live_tail_reads_the_same_events(live_log: Path) -> None:
    """The monitor feeds lines one by one as they arrive: same events as the whole file."""
    text = live_log.read_text(encoding="utf-8", errors="replace")
    tail = LogParser()
    by_line = [event for line in text.splitlines() for event in tail.feed(line)]
    assert by_line == LogParser().feed_text(text)
    assert by_line == LogParser(prefilter=False).feed_text(text)
