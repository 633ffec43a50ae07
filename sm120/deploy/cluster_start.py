"""What starting a multi-node deployment takes, kept so the monitor can start it again.

A single host restarts from one argv (monitor/launch_spec.json). A deployment over several
nodes starts node by node, after a preflight of every node, so its relaunch runs the launch's
own steps (sm120.deploy.cluster) again from this: the plan as checked (not the recipe as it
reads by then), the node addresses, the runtime and SSH options, the engine's Python as the
launch resolved it, the key file (never the key) and the time budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sm120.core.errors import PlanError, SM120Error
from sm120.engine.cluster.hosts import parse_ssh_options
from sm120.engine.state import deployment_dir, write_private_atomically
from sm120.plan.resolve import LaunchPlan
from sm120.plan.stored import plan_from_data, plan_to_data
from sm120.render.multinode import NodeAddress

CLUSTER_START_FILE = "monitor/cluster_start.json"


@dataclass(frozen=True)
class ClusterRequest:
    nodes: list[NodeAddress]
    runtime: str = "native"  # native: the engine's Python over SSH; docker: Docker over ssh://
    ssh_options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        parse_ssh_options(self.ssh_options)


@dataclass(frozen=True)
class ClusterStart:
    name: str
    plan: LaunchPlan
    """As checked, before preflight settles the interface (a relaunch settles it again)."""
    request: ClusterRequest
    python: str
    key_file: str
    budget_s: float
    """How long forming a Ray cluster may take."""


def cluster_start_path(name: str) -> Path:
    return deployment_dir(name) / CLUSTER_START_FILE


def save_cluster_start(start: ClusterStart) -> None:
    request = start.request
    data = {
        "name": start.name,
        "plan": plan_to_data(start.plan),
        "nodes": [{"host": node.host, "address": node.address} for node in request.nodes],
        "runtime": request.runtime,
        "ssh_options": list(request.ssh_options),
        "python": start.python,
        "key_file": start.key_file,
        "budget_s": start.budget_s,
    }
    path = cluster_start_path(start.name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private_atomically(path, json.dumps(data, indent=2) + "\n")


def load_cluster_start(name: str) -> ClusterStart | None:
    """None when the deployment has none (a single host, or launched without a monitor)."""
    path = cluster_start_path(name)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        request = ClusterRequest(
            nodes=[NodeAddress(str(n["host"]), str(n["address"])) for n in data["nodes"]],
            runtime=str(data["runtime"]),
            ssh_options=tuple(str(option) for option in data["ssh_options"]),
        )
        return ClusterStart(
            name=str(data["name"]),
            plan=plan_from_data(data["plan"]),
            request=request,
            python=str(data["python"]),
            key_file=str(data["key_file"]),
            budget_s=float(data["budget_s"]),
        )
    except FileNotFoundError:
        return None
    except KeyError as exc:
        raise _unusable(path, name, f"{exc} is missing") from None
    except (OSError, ValueError, TypeError, PlanError) as exc:
        # PlanError: an ssh option edited into the record that --ssh-option would refuse.
        raise _unusable(path, name, str(exc)) from None


def _unusable(path: Path, name: str, problem: str) -> SM120Error:
    return SM120Error(f"{path} is unusable: {problem}", f"launch {name} again to write it anew")
