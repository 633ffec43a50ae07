"""One local process per multi-node deployment that gathers every node's log into serve.log.

Usage: python -m sm120.engine.cluster.aggregate DEPLOYMENT

It follows each started process (cluster.json, re-read as the launcher adds processes) and
writes its lines as `[node1:engine] ...` into the deployment's serve.log, one writer so lines
never interleave. When a process ends it writes the deployment's exit.json (the first ending
is the deployment's: an engine missing a rank is dead), so `status` and the launcher's wait
see it without asking the nodes. It runs until SIGTERM (sm120 stop kills its process group,
which holds the ssh followers too).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from sm120.engine.cluster.node import Node, NodeError, ProcessState
from sm120.engine.cluster.nodes import node_from
from sm120.engine.cluster.record import EXIT_FILE, StartedProcess, load_record
from sm120.engine.runtime.base import ExitInfo
from sm120.engine.state import deployment_dir, write_private_atomically

POLL_S = 0.5


class Aggregator:
    def __init__(self, name: str) -> None:
        self.name = name
        folder = deployment_dir(name)
        self.log_path = folder / "logs" / "serve.log"
        self.exit_path = folder / EXIT_FILE
        self._lock = threading.Lock()
        self._followed: set[str] = set()
        self._nodes: dict[int, Node] = {}
        self._stopping = threading.Event()

    def write(self, line: str) -> None:
        with self._lock, self.log_path.open("a", encoding="utf-8") as log:
            log.write(line + "\n")

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        while not self._stopping.is_set():
            record = load_record(self.name)
            for process in record.processes if record else []:
                if process.handle in self._followed:
                    continue
                self._followed.add(process.handle)
                node = self._node(record.nodes if record else [], process.rank)
                if node is not None:
                    thread = threading.Thread(
                        target=self._follow, args=(node, process), daemon=True
                    )
                    thread.start()
            self._stopping.wait(POLL_S)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self._stopping.set()

    def _node(self, records: list[dict[str, object]], rank: int) -> Node | None:
        if rank not in self._nodes:
            for item in records:
                if item.get("rank") == rank:
                    self._nodes[rank] = node_from(dict(item))
        return self._nodes.get(rank)

    def _follow(self, node: Node, process: StartedProcess) -> None:
        label = process.label
        try:
            for line in node.follow(process.handle):
                self.write(f"[{label}] {line}")
        except (NodeError, OSError) as exc:
            self.write(f"[sm120] lost the log of {label}: {exc}")
        if self._stopping.is_set():
            return
        try:
            state = node.status(process.handle)
        except NodeError:
            state = ProcessState(running=False)
        if state.running:
            self.write(f"[sm120] the log of {label} ended while it still runs")
            return
        if state.gone:
            return  # sm120 stop removed it and records the ending itself
        self._record_exit(label, state)

    def _record_exit(self, label: str, state: ProcessState) -> None:
        info = record_exit(self.exit_path, label, state.exit, lock=self._lock)
        self.write(f"[sm120] {label} {info.describe()}")


def record_exit(
    exit_path: Path,
    label: str,
    ending: Mapping[str, Any] | None,
    *,
    lock: threading.Lock | None = None,
) -> ExitInfo:
    """Write the deployment's exit.json unless an earlier ending already did."""
    ending = ending or {}
    info = ExitInfo(
        returncode=ending.get("returncode"),
        signal=ending.get("signal"),
        ended_at=float(ending.get("ended_at") or time.time()),
    )
    with lock or contextlib.nullcontext():
        if not exit_path.exists():
            record = {
                "returncode": info.returncode,
                "signal": info.signal,
                "ended_at": info.ended_at,
                "process": label,
            }
            write_private_atomically(exit_path, json.dumps(record) + "\n")
    return info


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m sm120.engine.cluster.aggregate DEPLOYMENT")
    Path(deployment_dir(sys.argv[1]) / "logs").mkdir(mode=0o700, parents=True, exist_ok=True)
    Aggregator(sys.argv[1]).run()


if __name__ == "__main__":
    main()
