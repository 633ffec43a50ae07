"""The container log copier's logic against a stand-in for docker-py's container: restarts that
replay the log, a copier killed and started again, rotation, timestamps that sort, and the exit
record. The same copier runs against a real dockerd in tests/integration/test_docker_runtime.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from docker.errors import NotFound

from sm120.engine.runtime import docker_logs
from sm120.engine.runtime.docker_logs import ContainerLogSource, capture, stamp_key


def stamped(second: int, index: int, text: str) -> bytes:
    return f"2026-11-21T10:00:{second:02d}.{index:09d}Z {text}\n".encode()


class StandInContainer:
    """Runs through `runs`: each is the log lines that run adds. `logs()` replays everything
    written so far, as Docker does, in pieces that split lines."""

    def __init__(self, runs: list[list[str]], exit_code: int = 0) -> None:
        self.id = "c0ffee"
        self.runs = runs
        self.done = 0
        self.history: list[bytes] = []
        self.since_asked: list[int | None] = []
        self.status = "running"
        self.attrs = {"State": {"ExitCode": exit_code}}

    def logs(
        self, stream: bool, follow: bool, timestamps: bool, since: int | None
    ) -> Iterator[bytes]:
        assert stream and follow and timestamps
        self.since_asked.append(since)
        if self.done < len(self.runs):
            for text in self.runs[self.done]:
                self.history.append(stamped(self.done, len(self.history), text))
            self.done += 1
        self.status = "restarting" if self.done < len(self.runs) else "exited"
        data = b"".join(self.history)
        return iter([data[i : i + 7] for i in range(0, len(data), 7)])


class StandInClient:
    def __init__(self, container: StandInContainer) -> None:
        self.container: StandInContainer | None = container
        self.containers = self

    def get(self, ident: str) -> StandInContainer:
        if self.container is None or ident != self.container.id:
            raise NotFound("no such container")
        return self.container


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[StandInClient]]:
    made: list[StandInClient] = []
    monkeypatch.setattr(docker_logs.docker_api, "connect", lambda: made[0])
    monkeypatch.setattr(docker_logs, "RESTART_GRACE_S", 0.3)
    yield made


def test_restarts_replay_the_log_and_only_new_lines_are_written(
    tmp_path: Path, client: list[StandInClient]
) -> None:
    container = StandInContainer([["boot", "serving"], ["boot again", "serving again"]], 137)
    client.append(StandInClient(container))
    log, exit_file = tmp_path / "logs/serve.log", tmp_path / "exit.json"
    assert capture(container.id, log, exit_file) == 0
    assert log.read_text().splitlines() == ["boot", "serving", "boot again", "serving again"]
    # The second attach starts at the last line's whole second, not at the log's beginning.
    first_run_ended = datetime(2026, 11, 21, 10, 0, 0, tzinfo=timezone.utc).timestamp()
    assert container.since_asked == [None, int(first_run_ended)]
    record = json.loads(exit_file.read_text())
    assert (record["returncode"], record["signal"]) == (None, 9)
    assert (tmp_path / "logs/capture.json").is_file()


def copied_once(
    tmp_path: Path, client: list[StandInClient], lines: list[str]
) -> tuple[StandInContainer, Path, Path]:
    """A container that printed `lines` and exited, copied by one copier run."""
    container = StandInContainer([lines])
    client.append(StandInClient(container))
    log, exit_file = tmp_path / "logs/serve.log", tmp_path / "exit.json"
    capture(container.id, log, exit_file)
    return container, log, exit_file


def test_a_copier_started_again_goes_on_where_the_last_one_stopped(
    tmp_path: Path, client: list[StandInClient]
) -> None:
    first, log, exit_file = copied_once(tmp_path, client, ["one", "two"])
    # The same container, found again by a new copier, now with more output.
    first.runs.append(["three"])
    first.status = "running"
    capture(first.id, log, exit_file)
    assert log.read_text().splitlines() == ["one", "two", "three"]


def test_lines_written_but_not_yet_in_the_cursor_are_not_written_twice(
    tmp_path: Path, client: list[StandInClient]
) -> None:
    container, log, exit_file = copied_once(tmp_path, client, ["one", "two"])
    cursor = tmp_path / "logs/capture.json"
    saved = json.loads(cursor.read_text())
    # As if killed after writing "two" but before saving the cursor past "one".
    saved["offset"] = len(b"one\n")
    saved["position"] = stamp_key(stamped(0, 0, "").decode().split(" ")[0])
    cursor.write_text(json.dumps(saved))
    container.status = "running"
    capture(container.id, log, exit_file)
    assert log.read_text().splitlines() == ["one", "two"]


def test_the_copier_rotates_serve_log(tmp_path: Path, client: list[StandInClient]) -> None:
    lines = [f"line {i:04d} " + "x" * 50 for i in range(400)]
    container = StandInContainer([lines])
    client.append(StandInClient(container))
    log = tmp_path / "logs/serve.log"
    capture(container.id, log, tmp_path / "exit.json", max_bytes=4096, backups=20)
    files = [log.with_name(f"serve.log.{i}") for i in range(20, 0, -1)] + [log]
    present = [path for path in files if path.exists()]
    assert len(present) > 5
    assert all(path.stat().st_size <= 4096 for path in present)
    assert b"".join(path.read_bytes() for path in present).decode().splitlines() == lines


def test_a_removed_container_ends_the_copier_without_an_exit_record(
    tmp_path: Path, client: list[StandInClient]
) -> None:
    container = StandInContainer([["one"]])
    stand_in = StandInClient(container)
    client.append(stand_in)
    stand_in.container = None
    assert capture("c0ffee", tmp_path / "serve.log", tmp_path / "exit.json") == 0
    assert not (tmp_path / "exit.json").exists()


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("2026-11-21T10:00:00.123456789Z", "2026-11-21T10:00:00.5Z"),
        ("2026-11-21T10:00:00Z", "2026-11-21T10:00:00.000000001Z"),
        ("2026-11-21T10:00:00.999999999Z", "2026-11-21T10:00:01.000000000Z"),
    ],
)
def test_stamps_sort_in_time_order_even_with_trailing_zeros_cut(earlier: str, later: str) -> None:
    assert stamp_key(earlier) < stamp_key(later)


def test_source_identity_is_the_container_id() -> None:
    container: Any = StandInContainer([["x"]])
    assert ContainerLogSource(container).identity == "c0ffee"
