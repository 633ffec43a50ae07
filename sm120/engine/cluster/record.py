"""cluster.json: the nodes of a multi-node deployment and what was started on each, in order.

Written after every start, so a stop (or a failed launch) finds everything that runs even
when the launcher died half-way; read by the log aggregator to know what to follow.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sm120.engine.state import deployment_dir, write_private_atomically

RECORD_FILE = "cluster.json"
EXIT_FILE = "exit.json"
AGGREGATOR_LOG = "aggregator.log"


@dataclass
class StartedProcess:
    rank: int
    name: str
    handle: str

    @property
    def label(self) -> str:
        return f"node{self.rank}:{self.name}"


@dataclass
class ClusterRecord:
    run_id: str
    nodes: list[dict[str, Any]]
    processes: list[StartedProcess] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterRecord:
        data = json.loads(text)
        return cls(
            run_id=data["run_id"],
            nodes=list(data["nodes"]),
            processes=[StartedProcess(**item) for item in data.get("processes", [])],
        )


def record_path(name: str) -> Path:
    return deployment_dir(name) / RECORD_FILE


def save_record(name: str, record: ClusterRecord) -> None:
    write_private_atomically(record_path(name), record.to_json())


def load_record(name: str) -> ClusterRecord | None:
    path = record_path(name)
    try:
        return ClusterRecord.from_json(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
