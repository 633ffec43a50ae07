"""The Runtime of a multi-node deployment: status, logs and stop through the local record.

`status` and `follow` never reach out to the nodes: the log aggregator mirrors every node's
output into serve.log and records the first process that ends in exit.json. `stop` reaches
every node that has something started (engines first, then Ray daemons), then ends the
aggregator.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sm120.core.defaults import STOP_TIMEOUT_S
from sm120.engine.background import start_detached
from sm120.engine.cluster.aggregate import record_exit
from sm120.engine.cluster.node import NodeError
from sm120.engine.cluster.nodes import node_from
from sm120.engine.cluster.record import (
    AGGREGATOR_LOG,
    EXIT_FILE,
    ClusterRecord,
    StartedProcess,
    load_record,
    save_record,
)
from sm120.engine.runtime.base import ExitInfo, LaunchSpec, RuntimeStatus
from sm120.engine.runtime.native import ExitFileAndLog
from sm120.engine.runtime.processes import OwnedGroup, RecordedProcess
from sm120.engine.state import DeploymentState, deployment_dir, private_dir

RUNTIME_NAME = "cluster"
AGGREGATOR_MODULE = "sm120.engine.cluster.aggregate"
AGGREGATOR_GRACE = 5.0

_aggregators: dict[int, subprocess.Popen[bytes]] = {}


class ClusterRuntime(ExitFileAndLog):
    kind = RUNTIME_NAME

    def start(self, spec: LaunchSpec, log_path: Path) -> DeploymentState:
        # Part of the Runtime protocol; one argv cannot describe several nodes.
        raise NodeError(
            f"{spec.name}: a multi-node deployment starts node by node",
            "use sm120 launch NAME --nodes HEAD,WORKER,...",
        )

    def start_aggregator(self, name: str) -> int:
        folder = deployment_dir(name)
        (folder / EXIT_FILE).unlink(missing_ok=True)
        private_dir(folder / "logs")
        process = start_detached(
            [sys.executable, "-m", AGGREGATOR_MODULE, name], folder / AGGREGATOR_LOG
        )
        _aggregators[process.pid] = process
        return process.pid

    def stop(self, state: DeploymentState, timeout: float = STOP_TIMEOUT_S) -> ExitInfo | None:
        record = load_record(state.name)
        errors: list[NodeError] = []
        if record is not None:
            errors = stop_processes(state.name, record, timeout)
        _end_group(aggregator_group(state))
        if errors:
            raise errors[0]
        return self.exit_info(state)

    def status(self, state: DeploymentState) -> RuntimeStatus:
        exit_info = self.exit_info(state)
        running = exit_info is None and bool(aggregator_group(state).members())
        return RuntimeStatus(running=running, exit=exit_info, pid=None)


def aggregator_group(state: DeploymentState) -> OwnedGroup:
    """The local log aggregator's process group (it leads a session of its own)."""
    marker = (AGGREGATOR_MODULE, state.name)
    return OwnedGroup(RecordedProcess(state.supervisor_pid, state.supervisor_start, marker))


def stop_processes(name: str, record: ClusterRecord, timeout: float) -> list[NodeError]:
    """Engines first (all nodes at once), then what they ran on (Ray daemons). Processes that
    stopped are dropped from the record, so a retry after an unreachable node redoes only it."""
    nodes = {int(item["rank"]): node_from(item) for item in record.nodes}
    engines = [p for p in record.processes if p.name == "engine"]
    others = [p for p in record.processes if p.name != "engine"]
    errors: list[NodeError] = []
    for stage in (engines, others):
        if not stage:
            continue

        def stop_one(process: StartedProcess) -> NodeError | None:
            try:
                ending = nodes[process.rank].stop(process.handle, timeout)
            except NodeError as exc:
                return exc
            if process.rank == 0 and process.name == "engine":
                record_exit(deployment_dir(name) / EXIT_FILE, process.label, ending)
            return None

        with ThreadPoolExecutor(max_workers=len(stage)) as pool:
            results = list(pool.map(stop_one, stage))
        for process, error in zip(stage, results, strict=True):
            if error is None:
                record.processes.remove(process)
            else:
                errors.append(error)
        save_record(name, record)
    return errors


def _end_group(group: OwnedGroup) -> None:
    """The aggregator and its ssh followers: SIGTERM, then SIGKILL; only while the group is
    still the one this deployment started."""
    if group.members():
        _signal_all(group, signal.SIGTERM)
        deadline = time.monotonic() + AGGREGATOR_GRACE
        while group.members() and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_all(group, signal.SIGKILL)
    # Started by this process (a launch that failed): reap it, so no zombie stays behind.
    started = _aggregators.pop(group.pgid, None)
    if started is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            started.wait(timeout=AGGREGATOR_GRACE)


def _signal_all(group: OwnedGroup, signum: int) -> None:
    for pid in group.members():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
