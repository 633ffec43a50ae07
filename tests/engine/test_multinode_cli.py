"""`sm120 launch NAME --nodes ...`: parsing, layout matching, the dry-run `nodes`, and every
one-line error."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sm120.core.errors import PlanError
from sm120.engine.cluster.hosts import parse_nodes
from tests.helpers import invoke

PAIR = "root@10.0.0.1,root@10.0.0.2"


def test_parse_nodes_keeps_user_and_address() -> None:
    nodes = parse_nodes(" root@10.0.0.1 , spark2 ")
    assert [(n.host, n.address) for n in nodes] == [
        ("root@10.0.0.1", "10.0.0.1"),
        ("spark2", "spark2"),
    ]
    assert nodes[0].is_ip and not nodes[1].is_ip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (",", "--nodes is empty"),
        ("a,a", "--nodes names a twice"),
        ("root@a,b@a", "--nodes names a twice"),
        ("a,b c", "--nodes: 'b c' is not [user@]host"),
        ("a,b;rm -rf", "--nodes: 'b;rm -rf' is not [user@]host"),
        ("a,b:22", "--nodes: 'b:22' is not [user@]host"),
        ("a,,b", "--nodes: '' is not [user@]host"),
    ],
)
def test_parse_nodes_errors(text: str, message: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_nodes(text)
    assert caught.value.one_line() == (
        f"{message} (hint: --nodes HEAD,WORKER,... names each host once, the head first, "
        "e.g. --nodes spark1,spark2)"
    )


def test_dry_run_json_has_one_object_per_node(cli: CliRunner) -> None:
    code, out, _ = invoke(
        cli, "launch", "tiny", "-V", "2node", "--nodes", PAIR, "--dry-run", "--json"
    )
    assert code == 0
    document = json.loads(out)
    assert [node["host"] for node in document["nodes"]] == ["root@10.0.0.1", "root@10.0.0.2"]
    for node in document["nodes"]:
        assert {"host", "image", "argv", "env"} <= set(node)
        assert node["image"] == document["image"]  # the one image built for the plan
    assert document["nodes"][1]["argv"][-1] == "--headless"
    assert document["multinode"]["executor"] == "native"


def test_dry_run_text_lists_the_nodes(cli: CliRunner) -> None:
    code, out, _ = invoke(
        cli,
        "launch",
        "tiny",
        "-V",
        "2node",
        "--set",
        "multinode.executor=ray",
        "--force",
        "S08",
        "--nodes",
        PAIR,
        "--dry-run",
    )
    assert code == 0
    assert "node0 head root@10.0.0.1" in out
    assert "ray-head: python3 -m ray.scripts.scripts start --head" in out
    assert "node1 worker root@10.0.0.2" in out


def test_dry_run_without_nodes_shows_the_layout_only(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "launch", "tiny", "-V", "2node", "--dry-run", "--json")
    assert code == 0
    document = json.loads(out)
    assert "nodes" not in document
    assert document["multinode"]["nodes"] == 2


def test_docker_dry_run_mounts_the_model(cli: CliRunner) -> None:
    code, out, _ = invoke(
        cli,
        "launch",
        "dsv4",
        "-V",
        "gb10x2",
        "--nodes",
        "spark1,spark2",
        "--runtime",
        "docker",
        "--model-dir",
        "/models/dsv4",
        "--dry-run",
        "--json",
    )
    assert code == 0
    nodes = json.loads(out)["nodes"]
    assert nodes[0]["argv"][3:5] == ["--model", "/model"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["tiny", "--nodes", PAIR],
            "Error: tiny has no multi-node layout in the chosen variants (hint: pick one with "
            "-V: 2node)",
        ),
        (
            ["glm47", "--nodes", PAIR],
            "Error: glm47 has no multi-node layout in the chosen variants (hint: this recipe "
            "serves on one host only; drop --nodes)",
        ),
        (
            ["tiny", "-V", "2node", "--nodes", "a,b,c"],
            "Error: --nodes names 3 hosts but the layout runs on 2 (hint: --nodes HEAD,WORKER,"
            "... names each host once, the head first, e.g. --nodes spark1,spark2)",
        ),
        (
            ["tiny", "-V", "2node", "--nodes", PAIR, "--runtime", "podman"],
            "Error: unknown runtime 'podman' (hint: use --runtime native or --runtime docker)",
        ),
    ],
)
def test_node_errors_are_one_line(cli: CliRunner, args: list[str], message: str) -> None:
    for mode in ([], ["--dry-run"]):
        code, out, err = invoke(cli, "launch", *args, *mode)
        assert code == 2
        assert err.strip() == message
        assert out == ""


def test_multinode_plan_without_nodes_is_refused(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "-V", "2node")
    assert code == 2
    assert err.strip() == (
        "Error: this plan spans 2 hosts (multinode layout) (hint: pass --nodes HEAD,WORKER,... "
        "(the head first), or pick a single-host variant)"
    )


def test_ssh_nodes_need_the_engine_python_for_gpu_recipes(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_PYTHON", raising=False)  # set for integration runs
    code, _, err = invoke(
        cli, "launch", "dsv4", "-V", "gb10x2", "--nodes", "10.0.0.1,10.0.0.2", "--model-dir", "/m"
    )
    assert code == 2
    assert err.strip() == (
        "Error: nodes reached over SSH run the engine's own Python, and none is named (hint: "
        "--vllm-python PATH (the same path on every node), or --runtime docker)"
    )


def test_a_gate_across_nodes_is_refused_before_anything_starts(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "launch", "tiny", "-V", "2node", "--nodes", PAIR, "--gate", "core")
    assert code == 2
    assert (
        err.strip() == "Error: --gate is for one host (hint: run 'sm120 test' once READY instead)"
    )
    assert out == ""
