"""sm120.deploy.session: one set of launch options for one host and for many, built from
every option given (the cluster path used to drop --network). Serving is replaced by a
recorder here; the real engine runs in tests/integration."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from sm120.deploy.cluster import ClusterRequest
from sm120.deploy.launcher import LaunchOptions
from tests.helpers import invoke

PAIR = "root@10.0.0.1,root@10.0.0.2"


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def serve(checked: object, options: LaunchOptions, **kwargs: Any) -> int:
        calls.append({"options": options, **kwargs})
        return 0

    monkeypatch.setattr("sm120.deploy.session.serve", serve)
    return calls


LAUNCH_FLAGS = [
    "--runtime", "docker", "--network", "host", "--name", "mine", "--api-key", "sk-x",
    "--vllm-python", "/opt/vllm/bin/python", "--timeout", "77", "--replace", "--no-monitor",
    "--yes",
]  # fmt: skip


def _options(call: dict[str, Any]) -> tuple[object, ...]:
    options: LaunchOptions = call["options"]
    return (
        options.name,
        options.docker_network,
        options.api_key,
        options.vllm_python,
        options.timeout_s,
        options.replace,
        options.monitor,
        options.confirm,
    )


def test_the_cluster_path_gets_every_launch_option(
    cli: CliRunner, served: list[dict[str, Any]]
) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "-V", "2node", "--nodes", PAIR, *LAUNCH_FLAGS)
    assert code == 0, err
    [call] = served
    assert _options(call) == (
        "mine", "host", "sk-x", "/opt/vllm/bin/python", 77.0, True, False, None,
    )  # fmt: skip
    cluster = call["cluster"]
    assert isinstance(cluster, ClusterRequest)
    assert [n.host for n in cluster.nodes] == ["root@10.0.0.1", "root@10.0.0.2"]
    assert cluster.runtime == "docker"


def test_one_host_and_many_build_the_same_options(
    cli: CliRunner, served: list[dict[str, Any]]
) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--gpus", "0", *LAUNCH_FLAGS)
    assert code == 0, err
    code, _, err = invoke(cli, "launch", "tiny", "-V", "2node", "--nodes", PAIR, *LAUNCH_FLAGS)
    assert code == 0, err
    one, many = served
    assert one["cluster"] is None and many["cluster"] is not None
    assert _options(one) == _options(many)
