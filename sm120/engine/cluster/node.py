"""The one narrow door to a node of a multi-node deployment.

Everything multi-node (preflight, start order, log aggregation, stop) talks to nodes only
through this protocol, so an SSH host running the engine's Python (SshNode) and a Docker
engine reached over ssh:// (DockerNode) fit the same flow, and tests hand in fakes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sm120.core.errors import SM120Error


class NodeError(SM120Error):
    """A node could not be reached or did not do what was asked."""


@dataclass(frozen=True)
class ProbeRequest:
    """What preflight wants to know from a node."""

    image: str
    model_dir: str | None = None
    # (bind address, port) pairs that must be free, on the head only.
    ports: tuple[tuple[str, int], ...] = ()
    gpus: int = 0


@dataclass(frozen=True)
class StartRequest:
    """One long-running process to start on a node, detached from the launcher."""

    deployment: str
    run_id: str
    rank: int
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    image: str
    gpus: int = 0
    model_dir: str | None = None
    container_model_dir: str | None = None
    shm_size: str = "16gb"
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProcessState:
    running: bool
    # {"returncode", "signal", "ended_at"} once it ended and the ending was recorded.
    exit: Mapping[str, Any] | None = None
    # Nothing of it is left on the node: stop removed it (or it never started).
    gone: bool = False


class Node(Protocol):
    label: str  # e.g. "node1 (root@10.0.0.2)", used in every message about this node

    def describe(self) -> dict[str, Any]:
        """What it takes to reach this node again from another process (see nodes_from)."""
        ...

    def probe(self, request: ProbeRequest) -> dict[str, Any]:
        """Read-only facts for preflight (see sm120/engine/cluster/agent.py probe)."""
        ...

    def start(self, request: StartRequest) -> str:
        """Start the process in the background; return a handle for the calls below."""
        ...

    def run(self, handle: str, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        """A short command beside a started process (same host or container): rc, output."""
        ...

    def status(self, handle: str) -> ProcessState: ...

    def follow(self, handle: str) -> Iterator[str]:
        """The process's output lines from its first, until it ended and all was read."""
        ...

    def stop(self, handle: str, timeout: float) -> Mapping[str, Any] | None:
        """SIGTERM, SIGKILL after timeout, and remove what start left on the node; return how
        the process ended (as ProcessState.exit) when that is known."""
        ...
