"""Per-node preflight: the facts every node reported, compared before anything starts.

A multi-node engine only comes up when the nodes agree: the same engine (image digest, or the
same installed packages for a native node), the same NCCL (seed 001: a per-node mismatch hangs
the handshake instead of failing), the same weights, an interface with the node's address and
one MTU for NCCL/Gloo, and free ports on the head. Each problem is one line naming the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

from sm120.core.errors import SM120Error
from sm120.engine.cluster.node import Node, ProbeRequest
from sm120.plan.resolve import LaunchPlan
from sm120.render.multinode import NodeAddress, is_ip

IFNAME_HINT = (
    "--set multinode.socket_ifname=IFACE names the interface that carries the nodes' "
    "addresses ('ip -br addr' lists them)"
)


class PreflightError(SM120Error):
    """The nodes disagree, or one lacks what the layout needs."""


@dataclass(frozen=True)
class NodeFacts:
    node: Node
    address: NodeAddress
    facts: dict[str, Any]


@dataclass(frozen=True)
class ClusterFacts:
    """What preflight settled: every node's fabric address and the interface to use."""

    addresses: list[NodeAddress]
    ifname: str


def probe_all(
    nodes: Sequence[Node], addresses: Sequence[NodeAddress], requests: Sequence[ProbeRequest]
) -> list[NodeFacts]:
    """All nodes at once: each probe is an SSH round trip plus hashing small files."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        results = list(pool.map(lambda n, r: n.probe(r), nodes, requests))
    return [NodeFacts(n, a, f) for n, a, f in zip(nodes, addresses, results, strict=True)]


def probe_requests(
    plan: LaunchPlan, count: int, *, image: str, model_dir: str | None, api_bind: str
) -> list[ProbeRequest]:
    layout = plan.multinode
    assert layout is not None
    head_port = layout.master_port if layout.executor == "native" else layout.ray_port
    gpus = layout.gpus_per_node
    # The API binds the plan's address; the rendezvous / Ray GCS listen on every interface.
    ports = ((api_bind, plan.port), ("0.0.0.0", head_port))
    head = ProbeRequest(image=image, model_dir=model_dir, ports=ports, gpus=gpus)
    worker = ProbeRequest(image=image, model_dir=model_dir, gpus=gpus)
    return [head, *([worker] * (count - 1))]


def check(plan: LaunchPlan, reports: Sequence[NodeFacts], *, docker: bool) -> ClusterFacts:
    """Raise PreflightError on the first disagreement; return the resolved addresses."""
    layout = plan.multinode
    assert layout is not None
    head = reports[0]
    for report in reports:
        _check_engine(head, report, docker=docker)
    for report in reports:
        _check_nccl(head, report, layout.nccl_version)
    for report in reports:
        _check_gpus(plan, report)
    ifname = layout.socket_ifname or _common_interface(reports)
    addresses = [_check_interface(report, ifname) for report in reports]
    for report in reports[1:]:
        _check_mtu(head, report, ifname)
    for report in reports:
        _check_weights(plan, head, report)
    _check_ports(head)
    return ClusterFacts(addresses=addresses, ifname=ifname)


def _fail(report: NodeFacts, message: str, hint: str) -> NoReturn:
    raise PreflightError(f"{report.node.label}: {message}", hint)


def _check_engine(head: NodeFacts, report: NodeFacts, *, docker: bool) -> None:
    if docker:
        mine, theirs = report.facts.get("image_id"), head.facts.get("image_id")
        if mine != theirs:
            _fail(
                report,
                f"runs image {mine}, the head runs {theirs}",
                "pull or load the same image digest on every node",
            )
        return
    mine, theirs = report.facts["engine"], head.facts["engine"]
    if mine["fingerprint"] == theirs["fingerprint"]:
        return
    ours, heads = mine["packages"], theirs["packages"]
    differing = sorted(name for name in set(ours) | set(heads) if ours.get(name) != heads.get(name))
    name = differing[0] if differing else "?"
    _fail(
        report,
        f"engine differs from the head's: {name} {ours.get(name, 'missing')} here, "
        f"{heads.get(name, 'missing')} on the head ({len(differing)} packages differ)",
        "install the same engine environment on every node (same packages, same versions)",
    )


def _check_nccl(head: NodeFacts, report: NodeFacts, pinned: str | None) -> None:
    mine = report.facts.get("nccl")
    if pinned is not None and mine != pinned:
        _fail(
            report,
            f"NCCL {mine or 'not installed'}, the layout pins {pinned}",
            f"pip install nvidia-nccl-cu13=={pinned} on every node; a per-node NCCL mismatch "
            "hangs the handshake (seed 001)",
        )
    theirs = head.facts.get("nccl")
    if mine != theirs:
        _fail(
            report,
            f"NCCL {mine or 'not installed'}, the head has {theirs or 'none'}",
            "pin one NCCL on every node; a per-node NCCL mismatch hangs the handshake (seed 001)",
        )


def _check_gpus(plan: LaunchPlan, report: NodeFacts) -> None:
    layout = plan.multinode
    assert layout is not None
    if layout.gpus_per_node == 0:
        return
    gpus = report.facts.get("gpus") or []
    if len(gpus) < layout.gpus_per_node:
        _fail(
            report,
            f"{len(gpus)} GPUs visible, the layout needs {layout.gpus_per_node} per node",
            "check nvidia-smi on the node (driver, container GPU access)",
        )
    wanted = set(plan.hardware.compute_caps)
    for gpu in gpus:
        major, _, minor = str(gpu.get("compute_cap", "")).partition(".")
        arch = f"sm_{major}{minor or '0'}"
        if arch not in wanted:
            _fail(
                report,
                f"GPU {gpu.get('name')} is {arch}, the recipe is validated on "
                f"{', '.join(sorted(wanted))}",
                "use nodes of the validated kind, or --force S06 on a single host to experiment",
            )


def _common_interface(reports: Sequence[NodeFacts]) -> str:
    """No interface declared: the one holding each node's address, if named alike everywhere."""
    names: set[str] = set()
    for report in reports:
        if not report.address.is_ip:
            raise PreflightError(
                f"{report.node.label}: no interface for NCCL/Gloo is declared and "
                f"{report.address.address} is a name, not an address",
                IFNAME_HINT,
            )
        holding = [
            name
            for name, info in report.facts.get("interfaces", {}).items()
            if info.get("address") == report.address.address
        ]
        if not holding:
            _fail(report, f"no interface has the address {report.address.address}", IFNAME_HINT)
        names.add(str(holding[0]))
    if len(names) != 1:
        raise PreflightError(
            "the nodes' addresses sit on differently named interfaces "
            f"({', '.join(sorted(names))})",
            IFNAME_HINT,
        )
    return names.pop()


def _check_interface(report: NodeFacts, ifname: str) -> NodeAddress:
    info = report.facts.get("interfaces", {}).get(ifname)
    if info is None:
        _fail(report, f"no network interface {ifname}", IFNAME_HINT)
    address = info.get("address")
    if not address:
        _fail(report, f"interface {ifname} has no IPv4 address", "bring it up with an address")
    if info.get("state") == "down":
        _fail(report, f"interface {ifname} is down", f"ip link set {ifname} up on the node")
    given = report.address.address
    if is_ip(given) and given != address:
        _fail(
            report,
            f"{given} is not on {ifname} ({ifname} has {address})",
            "name the node by its address on that interface, or pick the interface that has it",
        )
    # A host given by name: the ranks talk over the interface's address.
    return NodeAddress(host=report.address.host, address=address)


def _check_mtu(head: NodeFacts, report: NodeFacts, ifname: str) -> None:
    mine = report.facts["interfaces"][ifname].get("mtu")
    theirs = head.facts["interfaces"][ifname].get("mtu")
    if mine != theirs:
        _fail(
            report,
            f"MTU {mine} on {ifname}, the head has {theirs}",
            "set one MTU on every node's fabric interface (e.g. 9000 on RoCE links)",
        )


def _check_weights(plan: LaunchPlan, head: NodeFacts, report: NodeFacts) -> None:
    if not plan.model_dir:
        return
    model = report.facts.get("model") or {}
    if not model.get("exists"):
        _fail(
            report,
            f"no checkpoint at {plan.model_dir}",
            "copy the weights to the same path on every node",
        )
    revision = model.get("revision")
    if plan.model.revision and revision and revision != plan.model.revision:
        _fail(
            report,
            f"weights are revision {revision}, the recipe pins {plan.model.revision}",
            "download the pinned revision on every node",
        )
    theirs = (head.facts.get("model") or {}).get("files", {})
    if revision != (head.facts.get("model") or {}).get("revision"):
        _fail(
            report,
            f"weights are revision {revision}, the head has "
            f"{(head.facts.get('model') or {}).get('revision')}",
            "download the same revision on every node",
        )
    mine = model.get("files", {})
    differing = sorted(
        name for name in set(mine) | set(theirs) if mine.get(name) != theirs.get(name)
    )
    if differing:
        what = "missing" if differing[0] not in mine else "differs"
        _fail(
            report,
            f"weights differ from the head's: {differing[0]} {what} "
            f"({len(differing)} files differ)",
            "sync the checkpoint: the same files at the same path on every node",
        )


def _check_ports(head: NodeFacts) -> None:
    busy = head.facts.get("ports_in_use") or []
    if busy:
        _fail(
            head,
            f"port {busy[0]} is in use",
            "stop what holds it, or pick another (--port, --set multinode.master_port=N)",
        )
