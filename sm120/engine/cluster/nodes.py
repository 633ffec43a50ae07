"""Build the Node objects for a deployment, and rebuild them later from its record."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from sm120.engine.cluster.docker_node import DockerNode
from sm120.engine.cluster.node import Node, NodeError
from sm120.engine.cluster.ssh_node import RUN_ROOT, SshNode
from sm120.render.multinode import NodeAddress

RUNTIMES = ("native", "docker")
RUN_ROOT_ENV = "SM120_NODE_RUN_ROOT"


def make_nodes(
    addresses: Sequence[NodeAddress],
    *,
    runtime: str,
    python: str,
    ssh_options: Sequence[str] = (),
) -> list[Node]:
    """native: the engine's Python over SSH; docker: each host's Docker engine over ssh://."""
    if runtime == "native":
        # Where each node keeps pid, log and exit files of what sm120 started there.
        run_root = os.environ.get(RUN_ROOT_ENV, RUN_ROOT)
        return [
            SshNode(node.host, rank=rank, python=python, options=ssh_options, run_root=run_root)
            for rank, node in enumerate(addresses)
        ]
    if runtime == "docker":
        return [
            DockerNode(node.host, rank=rank, python=python) for rank, node in enumerate(addresses)
        ]
    raise NodeError(f"unknown runtime '{runtime}' for --nodes", f"use one of {', '.join(RUNTIMES)}")


def node_from(record: dict[str, Any]) -> Node:
    kind = record.get("kind")
    if kind == "ssh":
        return SshNode(
            record["host"],
            rank=int(record["rank"]),
            python=record["python"],
            options=record.get("options", []),
            run_root=record.get("run_root", RUN_ROOT),
            ssh=record.get("ssh", "ssh"),
        )
    if kind == "docker":
        return DockerNode(
            record["host"], rank=int(record["rank"]), python=record.get("python", "python3")
        )
    raise NodeError(f"unknown node kind {kind!r} in the deployment record", "upgrade sm120")
