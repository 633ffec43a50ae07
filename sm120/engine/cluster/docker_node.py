"""A node whose Docker engine is reached with the docker SDK over ssh:// (no daemon port).

Each process of the node runs in its own container on the host network (NCCL, Gloo and Ray
need the hosts' own addresses), labelled with the deployment so it can be found again.
`container_kwargs` is pure and renders the `containers.run` keyword arguments; the SDK accepts
plain dicts for ulimits and device requests. Not exercised against a real remote daemon here
(the test machines have no second Docker host); the rendering and the calls are unit-tested
with a fake client.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sm120.engine.cluster.node import NodeError, ProbeRequest, ProcessState, StartRequest
from sm120.engine.cluster.ssh_node import agent_source

KIND = "docker"
STACK_BYTES = 67108864
ClientFactory = Callable[[str], Any]


def docker_client(base_url: str) -> Any:
    try:
        import docker
    except ImportError:
        raise NodeError(
            "the docker SDK is not installed", "pip install docker (needed for --runtime docker)"
        ) from None
    # use_ssh_client: the system ssh, so ~/.ssh/config, agents and known_hosts apply.
    return docker.DockerClient(base_url=base_url, use_ssh_client=True)


def labels(request: StartRequest) -> dict[str, str]:
    return {
        "sm120.deployment": request.deployment,
        "sm120.run": request.run_id,
        "sm120.node-rank": str(request.rank),
        "sm120.process": request.name,
        **request.labels,
    }


def container_kwargs(request: StartRequest) -> dict[str, Any]:
    """`client.containers.run(**kwargs)` for one node process."""
    kwargs: dict[str, Any] = {
        "image": request.image,
        "entrypoint": [request.argv[0]],
        "command": list(request.argv[1:]),
        "environment": dict(request.env),
        "name": f"sm120-{request.deployment}-node{request.rank}-{request.name}",
        "labels": labels(request),
        "network_mode": "host",
        "ipc_mode": "host",
        "shm_size": request.shm_size,
        "ulimits": [
            {"name": "memlock", "soft": -1, "hard": -1},
            {"name": "stack", "soft": STACK_BYTES, "hard": STACK_BYTES},
        ],
        "detach": True,
    }
    if request.gpus:
        kwargs["device_requests"] = [
            {"driver": "nvidia", "count": request.gpus, "capabilities": [["gpu"]]}
        ]
    if request.model_dir and request.container_model_dir:
        kwargs["volumes"] = {request.model_dir: {"bind": request.container_model_dir, "mode": "ro"}}
    return kwargs


class DockerNode:
    def __init__(
        self,
        host: str,
        *,
        rank: int,
        python: str = "python3",
        client_factory: ClientFactory = docker_client,
    ) -> None:
        self.host = host
        self.rank = rank
        self.python = python
        self.base_url = f"ssh://{host}"
        self.label = f"node{rank} ({host})"
        self._client_factory = client_factory
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                self._client = self._client_factory(self.base_url)
            except NodeError:
                raise
            except Exception as exc:  # the SDK raises DockerException and friends
                raise NodeError(
                    f"{self.label}: cannot reach Docker at {self.base_url}: {exc}",
                    "check 'docker -H ssh://HOST info' works from here",
                ) from None
        return self._client

    def describe(self) -> dict[str, Any]:
        return {"kind": KIND, "host": self.host, "rank": self.rank, "python": self.python}

    def probe(self, request: ProbeRequest) -> dict[str, Any]:
        try:
            image = self.client.images.get(request.image)
        except Exception:
            raise NodeError(
                f"{self.label}: image {request.image} is not on this node",
                "pull or load the same image digest on every node",
            ) from None
        payload = {"model_dir": request.model_dir, "ports": [list(p) for p in request.ports]}
        run: dict[str, Any] = {
            "image": request.image,
            "entrypoint": [self.python],
            "command": ["-c", agent_source(), "probe", json.dumps(payload)],
            "network_mode": "host",
            "remove": True,
            "stdout": True,
            "stderr": False,
        }
        if request.model_dir:
            # Same path inside, so file lists compare with the other nodes'.
            run["volumes"] = {request.model_dir: {"bind": request.model_dir, "mode": "ro"}}
        if request.gpus:
            run["device_requests"] = [
                {"driver": "nvidia", "count": request.gpus, "capabilities": [["gpu"]]}
            ]
        output = self.client.containers.run(**run)
        text = output.decode("utf-8", "replace") if isinstance(output, bytes) else str(output)
        try:
            facts: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise NodeError(
                f"{self.label}: the probe container printed no facts", "see docker logs"
            ) from None
        facts["image_id"] = image.id
        facts["repo_digests"] = list(image.attrs.get("RepoDigests") or [])
        return facts

    def start(self, request: StartRequest) -> str:
        try:
            container = self.client.containers.run(**container_kwargs(request))
        except Exception as exc:
            raise NodeError(
                f"{self.label}: starting {request.name} failed: {exc}", "see the message above"
            ) from None
        return str(container.id)

    def _container(self, handle: str) -> Any:
        client = self.client  # an unreachable daemon is a NodeError, not a missing container
        try:
            return client.containers.get(handle)
        except Exception:
            return None

    def run(self, handle: str, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        container = self._container(handle)
        if container is None:
            return 125, f"container {handle} is gone"
        result = container.exec_run(list(argv))
        output = result.output.decode("utf-8", "replace") if result.output else ""
        return int(result.exit_code or 0), output

    def status(self, handle: str) -> ProcessState:
        container = self._container(handle)
        if container is None:
            return ProcessState(running=False, exit=None, gone=True)
        container.reload()
        state = container.attrs.get("State", {})
        if state.get("Running"):
            return ProcessState(running=True)
        return ProcessState(
            running=False,
            exit={"returncode": state.get("ExitCode"), "signal": None, "ended_at": time.time()},
        )

    def follow(self, handle: str) -> Iterator[str]:
        container = self._container(handle)
        if container is None:
            return
        partial = b""
        for chunk in container.logs(stream=True, follow=True):
            partial += chunk
            *lines, partial = partial.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if partial:
            yield partial.decode("utf-8", "replace")

    def stop(self, handle: str, timeout: float) -> dict[str, Any] | None:
        container = self._container(handle)
        if container is None:
            return None  # already gone
        with contextlib.suppress(Exception):
            container.stop(timeout=int(timeout))
        ending = self.status(handle).exit
        container.remove(force=True)
        return dict(ending) if ending else None
