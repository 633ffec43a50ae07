"""Per-node preflight: each disagreement is one line that names the node (facts are the
agent's probe output, made up here; the agent itself is tested in test_cluster_agent.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sm120.engine.cluster.hosts import parse_nodes
from sm120.engine.cluster.preflight import (
    ClusterFacts,
    NodeFacts,
    PreflightError,
    check,
    probe_requests,
)
from sm120.plan.resolve import LaunchPlan, PlanRequest, resolve

HOSTS = "root@10.0.0.1,root@10.0.0.2"
FILES = {"config.json": "sha256:aa", "model.safetensors": "sha256:bb"}


class Labelled:
    def __init__(self, label: str) -> None:
        self.label = label


def facts(address: str, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "engine": {"fingerprint": "f1", "packages": {"vllm": "0.32.0", "torch": "2.13.0"}},
        "nccl": "2.30.7",
        "interfaces": {
            "lo": {"mtu": 65536, "state": "unknown", "address": "127.0.0.1"},
            "mn0": {"mtu": 9000, "state": "up", "address": address},
        },
        "gpus": [{"name": "NVIDIA GB10", "compute_cap": "12.1"}],
        "model": {"exists": True, "revision": None, "files": dict(FILES)},
        "ports_in_use": [],
        "image_id": "sha256:img",
    }
    base.update(changes)
    return base


def plan(
    *sets: str, recipe: str = "dsv4", variant: str = "gb10x2", model_dir: str = "/m"
) -> LaunchPlan:
    return resolve(PlanRequest(recipe=recipe, variants=(variant,), sets=sets, model_dir=model_dir))


def reports(head: dict[str, Any], worker: dict[str, Any], hosts: str = HOSTS) -> list[NodeFacts]:
    nodes = parse_nodes(hosts)
    return [
        NodeFacts(Labelled(f"node{i} ({n.host})"), n, f)  # type: ignore[arg-type]
        for i, (n, f) in enumerate(zip(nodes, (head, worker), strict=True))
    ]


def failure(resolved: LaunchPlan, head: dict[str, Any], worker: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(PreflightError) as caught:
        check(resolved, reports(head, worker, **kw), docker=False)
    return caught.value.one_line()


def test_agreeing_nodes_pass_and_keep_their_addresses() -> None:
    result = check(plan(), reports(facts("10.0.0.1"), facts("10.0.0.2")), docker=False)
    assert result == ClusterFacts(addresses=parse_nodes(HOSTS), ifname="mn0")


def test_interface_is_found_from_the_address_when_none_is_declared() -> None:
    assert (
        check(plan(), reports(facts("10.0.0.1"), facts("10.0.0.2")), docker=False).ifname == "mn0"
    )


def test_hostnames_are_resolved_to_the_interface_address() -> None:
    result = check(
        plan("multinode.socket_ifname=mn0"),
        reports(facts("10.0.0.1"), facts("10.0.0.2"), hosts="spark1,spark2"),
        docker=False,
    )
    assert [a.address for a in result.addresses] == ["10.0.0.1", "10.0.0.2"]
    assert [a.host for a in result.addresses] == ["spark1", "spark2"]


def test_engine_mismatch_names_the_package() -> None:
    worker = facts("10.0.0.2")
    worker["engine"] = {"fingerprint": "f2", "packages": {"vllm": "0.31.0", "torch": "2.13.0"}}
    assert failure(plan(), facts("10.0.0.1"), worker) == (
        "node1 (root@10.0.0.2): engine differs from the head's: vllm 0.31.0 here, 0.32.0 on "
        "the head (1 packages differ) (hint: install the same engine environment on every node "
        "(same packages, same versions))"
    )


def test_image_digest_mismatch_on_docker_nodes() -> None:
    worker = facts("10.0.0.2", image_id="sha256:other")
    with pytest.raises(PreflightError) as caught:
        check(plan(), reports(facts("10.0.0.1"), worker), docker=True)
    assert caught.value.one_line() == (
        "node1 (root@10.0.0.2): runs image sha256:other, the head runs sha256:img (hint: pull "
        "or load the same image digest on every node)"
    )


def test_nccl_mismatch_between_nodes() -> None:
    head = facts("10.0.0.1", nccl="2.28.9")
    worker = facts("10.0.0.2", nccl="2.30.7")
    resolved = plan("multinode.nccl_version=null")
    assert failure(resolved, head, worker) == (
        "node1 (root@10.0.0.2): NCCL 2.30.7, the head has 2.28.9 (hint: pin one NCCL on every "
        "node; a per-node NCCL mismatch hangs the handshake (seed 001))"
    )


def test_nccl_pin_of_the_layout() -> None:
    worker = facts("10.0.0.2", nccl="2.30.5")
    assert failure(plan(), facts("10.0.0.1"), worker) == (
        "node1 (root@10.0.0.2): NCCL 2.30.5, the layout pins 2.30.7 (hint: pip install "
        "nvidia-nccl-cu13==2.30.7 on every node; a per-node NCCL mismatch hangs the handshake "
        "(seed 001))"
    )


def test_nccl_pin_checks_the_head_too() -> None:
    head = facts("10.0.0.1", nccl=None)
    assert failure(plan(), head, facts("10.0.0.2")).startswith(
        "node0 (root@10.0.0.1): NCCL not installed, the layout pins 2.30.7"
    )


def test_missing_gpu() -> None:
    worker = facts("10.0.0.2", gpus=[])
    assert failure(plan(), facts("10.0.0.1"), worker) == (
        "node1 (root@10.0.0.2): 0 GPUs visible, the layout needs 1 per node (hint: check "
        "nvidia-smi on the node (driver, container GPU access))"
    )


def test_wrong_gpu_arch() -> None:
    worker = facts("10.0.0.2", gpus=[{"name": "RTX 4090", "compute_cap": "8.9"}])
    assert failure(plan(), facts("10.0.0.1"), worker).startswith(
        "node1 (root@10.0.0.2): GPU RTX 4090 is sm_89, the recipe is validated on sm_121"
    )


def test_declared_interface_missing() -> None:
    worker = facts("10.0.0.2")
    del worker["interfaces"]["mn0"]
    assert failure(plan("multinode.socket_ifname=mn0"), facts("10.0.0.1"), worker) == (
        "node1 (root@10.0.0.2): no network interface mn0 (hint: --set "
        "multinode.socket_ifname=IFACE names the interface that carries the nodes' addresses "
        "('ip -br addr' lists them))"
    )


def test_interface_without_the_nodes_address() -> None:
    worker = facts("10.0.0.7")
    assert failure(plan("multinode.socket_ifname=mn0"), facts("10.0.0.1"), worker) == (
        "node1 (root@10.0.0.2): 10.0.0.2 is not on mn0 (mn0 has 10.0.0.7) (hint: name the node "
        "by its address on that interface, or pick the interface that has it)"
    )


def test_no_interface_holds_the_address() -> None:
    worker = facts("10.0.0.7")
    assert failure(plan(), facts("10.0.0.1"), worker).startswith(
        "node1 (root@10.0.0.2): no interface has the address 10.0.0.2"
    )


def test_interface_down() -> None:
    worker = facts("10.0.0.2")
    worker["interfaces"]["mn0"]["state"] = "down"
    assert failure(plan(), facts("10.0.0.1"), worker) == (
        "node1 (root@10.0.0.2): interface mn0 is down (hint: ip link set mn0 up on the node)"
    )


def test_hostnames_need_a_declared_interface() -> None:
    with pytest.raises(PreflightError) as caught:
        check(plan(), reports(facts("10.0.0.1"), facts("10.0.0.2"), hosts="a,b"), docker=False)
    assert caught.value.one_line().startswith(
        "node0 (a): no interface for NCCL/Gloo is declared and a is a name, not an address"
    )


def test_differently_named_interfaces() -> None:
    worker = facts("10.0.0.2")
    worker["interfaces"]["eth9"] = worker["interfaces"].pop("mn0")
    with pytest.raises(PreflightError) as caught:
        check(plan(), reports(facts("10.0.0.1"), worker), docker=False)
    assert caught.value.one_line().startswith(
        "the nodes' addresses sit on differently named interfaces (eth9, mn0)"
    )


def test_mtu_mismatch() -> None:
    worker = facts("10.0.0.2")
    worker["interfaces"]["mn0"]["mtu"] = 1500
    assert failure(plan(), facts("10.0.0.1"), worker) == (
        "node1 (root@10.0.0.2): MTU 1500 on mn0, the head has 9000 (hint: set one MTU on every "
        "node's fabric interface (e.g. 9000 on RoCE links))"
    )


def test_missing_checkpoint() -> None:
    worker = facts("10.0.0.2", model={"exists": False})
    assert failure(plan(), facts("10.0.0.1"), worker) == (
        "node1 (root@10.0.0.2): no checkpoint at /m (hint: copy the weights to the same path on "
        "every node)"
    )


def test_weights_differ() -> None:
    worker = facts("10.0.0.2")
    worker["model"]["files"]["model.safetensors"] = "sampled:cc"
    assert failure(plan(), facts("10.0.0.1"), worker) == (
        "node1 (root@10.0.0.2): weights differ from the head's: model.safetensors differs (1 "
        "files differ) (hint: sync the checkpoint: the same files at the same path on every "
        "node)"
    )


def test_weights_missing_a_file() -> None:
    worker = facts("10.0.0.2")
    del worker["model"]["files"]["config.json"]
    assert "config.json missing" in failure(plan(), facts("10.0.0.1"), worker)


def test_weights_revision_differs_between_nodes() -> None:
    head = facts("10.0.0.1")
    head["model"]["revision"] = "abc"
    worker = copy.deepcopy(head)
    worker["interfaces"]["mn0"]["address"] = "10.0.0.2"
    worker["model"]["revision"] = "def"
    assert failure(plan(), head, worker).startswith(
        "node1 (root@10.0.0.2): weights are revision def, the head has abc"
    )


def test_weights_revision_against_the_recipe_pin() -> None:
    head = facts("10.0.0.1")
    head["model"]["revision"] = "abc"
    resolved = plan("model.revision=deadbeef")
    assert failure(resolved, head, facts("10.0.0.2")).startswith(
        "node0 (root@10.0.0.1): weights are revision abc, the recipe pins deadbeef"
    )


def test_busy_port_on_the_head() -> None:
    head = facts("10.0.0.1", ports_in_use=[8000])
    assert failure(plan(), head, facts("10.0.0.2")) == (
        "node0 (root@10.0.0.1): port 8000 is in use (hint: stop what holds it, or pick another "
        "(--port, --set multinode.master_port=N))"
    )


def test_cpu_layout_skips_gpus_and_nccl_pin() -> None:
    resolved = plan(recipe="tiny", variant="2node")
    head = facts("10.0.0.1", gpus=[], nccl=None)
    worker = facts("10.0.0.2", gpus=[], nccl=None)
    assert check(resolved, reports(head, worker), docker=False).ifname == "mn0"


def test_probe_requests_check_ports_on_the_head_only() -> None:
    requests = probe_requests(plan(), 2, image="img", model_dir="/m", api_bind="127.0.0.1")
    assert requests[0].ports == (("127.0.0.1", 8000), ("0.0.0.0", 29501))
    assert requests[1].ports == ()
    assert requests[0].gpus == requests[1].gpus == 1
    ray = probe_requests(
        plan(recipe="glm52", variant="gb10x6-ray"), 6, image="i", model_dir=None, api_bind="0.0.0.0"
    )
    assert ray[0].ports[1] == ("0.0.0.0", 6379)
