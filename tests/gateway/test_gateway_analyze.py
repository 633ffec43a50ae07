"""The request log and `gateway analyze` on a recorded Claude Code session shape: a volatile
system prompt (its billing header, the time), tools reordered, an earlier message edited."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sm120.gateway.analyze import analyze_log, render_analysis
from sm120.gateway.requestlog import RequestLog, log_files
from sm120.gateway.usage import Record, UsageWriter

PROMPT = "You are Claude Code, Anthropic's official CLI for Claude. SECRET-PINEAPPLE"
TOOLS = [
    {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}},
    {"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}},
]


def system(cch: str, clock: str) -> list[dict[str, Any]]:
    # Claude Code's shape: the billing header block, then the prompt with its environment.
    return [
        {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.119; cch={cch};"},
        {"type": "text", "text": f"{PROMPT}\n<env>\nToday's date: 2026-12-01 {clock}\n</env>"},
    ]


def turn(
    messages: list[dict[str, Any]],
    cch: str = "a1",
    clock: str = "10:00",
    tools: list[dict[str, Any]] = TOOLS,
) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "system": system(cch, clock),
        "tools": tools,
        "messages": messages,
    }


def conversation(n: int, edited: int | None = None) -> list[dict[str, Any]]:
    messages = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"message {i}" + (" (edited)" if i == edited else "")
        messages.append({"role": role, "content": [{"type": "text", "text": text}]})
    return messages


def logged(tmp_path: Path, bodies: list[tuple[str, dict[str, Any]]]) -> Path:
    path = tmp_path / "requests" / "requests.jsonl"
    path.parent.mkdir(mode=0o700)
    writer = UsageWriter(None, request_log=RequestLog(path))
    writer.start()
    for key, body in bodies:
        record = Record(key, "tiny", "messages", 200, time.monotonic(), body=body)
        record.tail = b'data: {"usage":{"input_tokens":100,"cache_read_input_tokens":40}}'
        writer.put(record)
    writer.close()
    return path


def test_each_change_between_turns_is_named_with_what_it_costs(tmp_path: Path) -> None:
    path = logged(
        tmp_path,
        [
            ("ann", turn(conversation(1))),
            ("ann", turn(conversation(3), clock="10:01")),  # the time moved
            ("ann", turn(conversation(5), clock="10:01", tools=TOOLS[::-1])),  # reordered
            ("ann", turn(conversation(7, edited=1), clock="10:01", tools=TOOLS[::-1])),
            ("ann", turn(conversation(9, edited=1), clock="10:01", tools=TOOLS[::-1])),  # clean
            # Another session (another first message): only the billing header moves.
            ("bob", turn([{"role": "user", "content": "hi"}], cch="x1")),
            (
                "bob",
                turn(
                    [
                        {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "yo"},
                        {"role": "user", "content": "go"},
                    ],
                    cch="x2",
                ),
            ),
        ],
    )
    text = path.read_text()
    assert "PINEAPPLE" not in text and "message 0" not in text  # structure, not text
    assert path.stat().st_mode & 0o777 == 0o600
    report = analyze_log(path, None, with_engines=False)
    ann, bob = report["sessions"]
    assert [(f["turn"], f["change"]) for f in ann["findings"]] == [
        (2, "a timestamp in the system prompt (line 4)"),
        (3, "reordered tools"),
        (4, "an edited earlier message (#2, assistant)"),
    ]
    assert [f["change"] for f in bob["findings"]] == [
        "Claude Code's billing header in the system prompt (line 1)"
    ]
    # The billing header is the prompt's first line: nothing of turn 2 can come from the cache.
    assert bob["findings"][0]["kept_pct"] == 0.0
    assert bob["findings"][0]["cacheable_pct"] > 50
    assert ann["findings"][1]["kept_pct"] < ann["findings"][1]["cacheable_pct"]
    assert ann["engine_cached_pct"] == 40.0
    only_bob = analyze_log(path, "bob", with_engines=False)
    assert [s["key"] for s in only_bob["sessions"]] == ["bob"]
    rendered = render_analysis(report)
    assert "turn 2: a timestamp in the system prompt (line 4)" in rendered
    assert "the engine reported 40.0% of it cached" in rendered


def test_the_log_rotates_and_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path, max_bytes=1000, kept=2)
    for n in range(100):
        log.write({"n": n, "pad": "x" * 80})
    files = log_files(path, kept=2)
    assert [f.name for f in files] == ["requests.jsonl.2", "requests.jsonl.1", "requests.jsonl"]
    assert all(f.stat().st_size <= 1000 for f in files)
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["n"] == 99
