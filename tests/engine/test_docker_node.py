"""DockerNode: the docker SDK over ssh://, against a fake client (no second Docker host here).
The fake runs the probe container's command locally, so the probe output is the real agent's."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sm120.engine.cluster.docker_node import DockerNode, container_kwargs, docker_client
from sm120.engine.cluster.node import NodeError, ProbeRequest, StartRequest
from sm120.engine.cluster.nodes import make_nodes, node_from
from sm120.engine.cluster.ssh_node import SshNode
from sm120.render.multinode import NodeAddress


class FakeContainer:
    def __init__(self, cid: str, kwargs: dict[str, Any]) -> None:
        self.id = cid
        self.kwargs = kwargs
        self.attrs: dict[str, Any] = {"State": {"Running": True, "ExitCode": 0}}
        self.calls: list[str] = []
        self.chunks = [b"first li", b"ne\nsecond\n", b"tail"]

    def reload(self) -> None:
        self.calls.append("reload")

    def logs(self, stream: bool, follow: bool) -> Iterator[bytes]:
        assert stream and follow
        return iter(self.chunks)

    def stop(self, timeout: int) -> None:
        self.calls.append(f"stop {timeout}")
        self.attrs["State"] = {"Running": False, "ExitCode": 137}

    def remove(self, force: bool) -> None:
        self.calls.append(f"remove force={force}")

    def exec_run(self, argv: list[str]) -> Any:
        return types.SimpleNamespace(exit_code=0, output=f"ran {' '.join(argv)}".encode())


class FakeContainers:
    def __init__(self) -> None:
        self.started: dict[str, FakeContainer] = {}
        self.runs: list[dict[str, Any]] = []

    def run(self, **kwargs: Any) -> Any:
        self.runs.append(kwargs)
        if kwargs.get("detach"):
            container = FakeContainer(f"c{len(self.started)}", kwargs)
            self.started[container.id] = container
            return container
        # A probe: run the command the way the image would, with the local interpreter.
        command = [sys.executable, *kwargs["command"]]
        return subprocess.run(command, capture_output=True, check=True).stdout

    def get(self, cid: str) -> FakeContainer:
        if cid not in self.started:
            raise LookupError(cid)
        return self.started[cid]


class FakeClient:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.containers = FakeContainers()
        self.images = types.SimpleNamespace(get=self._image)

    def _image(self, ref: str) -> Any:
        if ref == "missing:tag":
            raise LookupError(ref)
        return types.SimpleNamespace(id="sha256:abc", attrs={"RepoDigests": ["repo@sha256:def"]})


@pytest.fixture
def node() -> DockerNode:
    return DockerNode("root@spark1", rank=1, python="python3", client_factory=FakeClient)


def request(**changes: Any) -> StartRequest:
    base: dict[str, Any] = {
        "deployment": "dsv4",
        "run_id": "dsv4-1234",
        "rank": 1,
        "name": "engine",
        "argv": ("/opt/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "--headless"),
        "env": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "VLLM_API_KEY": "k"},
        "image": "sm120/dsv4-vllm:tag",
        "gpus": 1,
        "model_dir": "/models/dsv4",
        "container_model_dir": "/model",
        "shm_size": "32gb",
        "labels": {"sm120.plan-hash": "abc"},
    }
    base.update(changes)
    return StartRequest(**base)


def test_container_kwargs() -> None:
    kwargs = container_kwargs(request())
    assert kwargs["entrypoint"] == ["/opt/venv/bin/python"]
    assert kwargs["command"] == ["-m", "vllm.entrypoints.cli.main", "serve", "--headless"]
    assert kwargs["network_mode"] == "host" and kwargs["ipc_mode"] == "host"
    assert kwargs["device_requests"] == [
        {"driver": "nvidia", "count": 1, "capabilities": [["gpu"]]}
    ]
    assert kwargs["volumes"] == {"/models/dsv4": {"bind": "/model", "mode": "ro"}}
    assert kwargs["labels"] == {
        "sm120.deployment": "dsv4",
        "sm120.run": "dsv4-1234",
        "sm120.node-rank": "1",
        "sm120.process": "engine",
        "sm120.plan-hash": "abc",
    }
    assert kwargs["name"] == "sm120-dsv4-node1-engine"
    assert kwargs["detach"] is True


def test_cpu_container_without_model_has_no_gpus_or_volumes() -> None:
    kwargs = container_kwargs(request(gpus=0, model_dir=None))
    assert "device_requests" not in kwargs
    assert "volumes" not in kwargs


def test_node_talks_to_docker_over_ssh(node: DockerNode) -> None:
    assert node.base_url == "ssh://root@spark1"
    assert node.client.base_url == "ssh://root@spark1"


def test_start_status_follow_run_stop(node: DockerNode) -> None:
    handle = node.start(request())
    container = node.client.containers.started[handle]
    assert container.kwargs == container_kwargs(request())
    assert node.status(handle).running
    assert list(node.follow(handle)) == ["first line", "second", "tail"]
    assert node.run(handle, ["ray", "status"], timeout=5) == (0, "ran ray status")
    ending = node.stop(handle, timeout=10)
    assert container.calls[-3:] == ["stop 10", "reload", "remove force=True"]
    assert ending is not None and ending["returncode"] == 137


def test_status_of_a_removed_container_is_gone(node: DockerNode) -> None:
    state = node.status("nope")
    assert state.gone and not state.running
    assert node.stop("nope", timeout=1) is None


def test_probe_runs_the_agent_in_the_image(node: DockerNode, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    facts = node.probe(ProbeRequest(image="sm120/dsv4-vllm:tag", model_dir=str(tmp_path), gpus=1))
    run = node.client.containers.runs[-1]
    assert run["entrypoint"] == ["python3"]
    assert run["network_mode"] == "host" and run["remove"] is True
    assert run["volumes"] == {str(tmp_path): {"bind": str(tmp_path), "mode": "ro"}}
    assert run["device_requests"][0]["count"] == 1
    assert facts["image_id"] == "sha256:abc"
    assert facts["repo_digests"] == ["repo@sha256:def"]
    assert list(facts["model"]["files"]) == ["config.json"]
    assert "lo" in facts["interfaces"]


def test_missing_image_is_one_line(node: DockerNode) -> None:
    with pytest.raises(NodeError) as caught:
        node.probe(ProbeRequest(image="missing:tag"))
    assert caught.value.one_line() == (
        "node1 (root@spark1): image missing:tag is not on this node (hint: pull or load the "
        "same image digest on every node)"
    )


def test_unreachable_docker_is_one_line() -> None:
    def refuse(base_url: str) -> Any:
        raise ConnectionError("ssh: connect to host spark9 port 22: No route to host")

    node = DockerNode("spark9", rank=2, client_factory=refuse)
    with pytest.raises(NodeError) as caught:
        node.status("x")  # status swallows container errors, but not an unreachable daemon
    assert caught.value.one_line() == (
        "node2 (spark9): cannot reach Docker at ssh://spark9: ssh: connect to host spark9 port "
        "22: No route to host (hint: check 'docker -H ssh://HOST info' works from here)"
    )


def test_docker_client_uses_the_system_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    fake_sdk = types.ModuleType("docker")
    fake_sdk.DockerClient = lambda **kwargs: seen.update(kwargs) or "client"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "docker", fake_sdk)
    assert docker_client("ssh://root@spark1") == "client"
    assert seen == {"base_url": "ssh://root@spark1", "use_ssh_client": True}


def test_missing_docker_sdk_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)
    with pytest.raises(NodeError) as caught:
        docker_client("ssh://h")
    assert caught.value.one_line() == (
        "the docker SDK is not installed (hint: pip install docker (needed for --runtime docker))"
    )


def test_nodes_are_rebuilt_from_their_record() -> None:
    addresses = [NodeAddress("root@a", "a"), NodeAddress("b", "b")]
    docker_nodes = make_nodes(addresses, runtime="docker", python="/opt/venv/bin/python")
    rebuilt = node_from(docker_nodes[1].describe())
    assert isinstance(rebuilt, DockerNode)
    assert (rebuilt.host, rebuilt.rank, rebuilt.python) == ("b", 1, "/opt/venv/bin/python")
    ssh_nodes = make_nodes(
        addresses, runtime="native", python="/e/bin/python", ssh_options=["Port=2222"]
    )
    again = node_from(ssh_nodes[0].describe())
    assert isinstance(again, SshNode)
    assert again.describe() == ssh_nodes[0].describe()
    assert again.options == ("Port=2222",)


def test_unknown_node_kind_is_refused() -> None:
    with pytest.raises(NodeError, match="unknown node kind 'lxc'"):
        node_from({"kind": "lxc"})
