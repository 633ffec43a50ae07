"""docker_api's small parsers, on the shapes the Docker engine returns (the real engine is
exercised in tests/integration/test_docker_runtime.py)."""

from __future__ import annotations

from typing import Any

from docker.errors import APIError

from sm120.engine.docker_api import container_host_pids


class Container:
    def __init__(self, top: dict[str, Any] | Exception) -> None:
        self._top = top

    def top(self, ps_args: str) -> dict[str, Any]:
        assert ps_args == "-o pid"
        if isinstance(self._top, Exception):
            raise self._top
        return self._top


def test_host_pids_come_from_the_pid_column() -> None:
    listing = {"Titles": ["PID"], "Processes": [["4242"], ["17"], ["4301"]]}
    assert container_host_pids(Container(listing)) == [17, 4242, 4301]


def test_the_pid_column_is_found_by_title() -> None:
    listing = {"Titles": ["UID", "PID", "CMD"], "Processes": [["root", "88", "python3"]]}
    assert container_host_pids(Container(listing)) == [88]


def test_a_container_docker_cannot_list_has_no_pids() -> None:
    assert container_host_pids(Container(APIError("is not running"))) == []
    assert container_host_pids(Container({"Titles": ["PID"], "Processes": None})) == []
