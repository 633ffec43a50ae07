"""`python -m sm120.deploy.cluster_monitor --name NAME`: the monitor of a deployment over
several nodes, with the relaunch of every node handed in.

Why a process of this layer: the monitor package (sm120.monitor) sits below deploy and must
not import it, yet restarting a multi-node engine is the launch's own sequence (per-node
preflight, start order, the Ray wait), which lives here. So deploy runs the monitor's
service itself and passes it a callable, rather than the monitor running a CLI command: the
relaunch then shares the monitor's lock, its stop signal (a `sm120 stop` cancels a relaunch
between steps) and its typed errors, with no second process to keep in step.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from sm120.core.errors import SM120Error
from sm120.deploy.cluster import relaunch_cluster
from sm120.deploy.cluster_start import ClusterStart, load_cluster_start
from sm120.engine.state import DeploymentState, check_deployment_name, deployment_dir
from sm120.monitor.files import MonitorFiles
from sm120.monitor.process import serve


class ClusterRelaunch:
    """The monitor's Relaunch for one deployment (sm120.monitor.watched.Relaunch)."""

    def __init__(self, start: ClusterStart, say: Callable[[str], None]) -> None:
        self.start = start
        self.say = say

    def __call__(
        self, state: DeploymentState, stop_timeout_s: float, cancelled: Callable[[], bool]
    ) -> DeploymentState:
        return relaunch_cluster(
            self.start, state, self.say, stop_timeout_s=stop_timeout_s, cancelled=cancelled
        )


def _to_stderr(line: str) -> None:
    sys.stderr.write(f"relaunch: {line}\n")
    sys.stderr.flush()


def serve_deployment(name: str, files: MonitorFiles) -> int:
    """The monitor of a deployment sm120 started, in this process, with the relaunch of
    every node when the deployment spans several (`sm120 monitor --serve` runs this too)."""
    start = load_cluster_start(name)
    relaunch = ClusterRelaunch(start, _to_stderr) if start is not None else None
    return serve(name, files, relaunch=relaunch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120.deploy.cluster_monitor")
    parser.add_argument("--name", required=True, help="deployment name (in the sm120 state dir)")
    args = parser.parse_args(argv)
    try:
        name = check_deployment_name(args.name)
        return serve_deployment(name, MonitorFiles(deployment_dir(name)))
    except SM120Error as exc:
        sys.stderr.write(f"Error: {exc.one_line()}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
