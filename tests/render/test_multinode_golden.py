"""Golden per-node renderings (argv, environment, services, Docker kwargs) for every
multi-node layout the recipes declare.

Refresh after an intended change with: pytest tests/render/test_multinode_golden.py --update-golden
"""

from __future__ import annotations

import json

import pytest

from sm120.engine.cluster.docker_node import container_kwargs
from sm120.engine.cluster.hosts import parse_nodes
from sm120.engine.cluster.node import StartRequest
from sm120.plan.resolve import PlanRequest, resolve
from sm120.recipe.loader import load_recipe, recipe_names
from sm120.render.compose import CONTAINER_MODEL_DIR
from sm120.render.multinode import render_nodes
from tests.helpers import GOLDEN_DIR

GOLDEN = GOLDEN_DIR / "multinode"
GB10_IF = ("multinode.socket_ifname=enp1s0f0np0",)
IF_ETH1 = ("multinode.socket_ifname=eth1",)
IF_CX7 = ("multinode.socket_ifname=enp1s0f1np1",)
PAIR = "root@10.0.0.1,root@10.0.0.2"
FOUR = "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4"
SIX = ",".join(f"10.0.0.{n}" for n in range(1, 7))
DSV4_DIR = "/models/DeepSeek-V4-Flash"
Case = tuple[str, str, str, tuple[str, ...], str, str | None]
# recipe, variant, --nodes, extra --set, runtime, --model-dir
CASES: list[Case] = [
    ("tiny", "2node", PAIR, IF_ETH1, "native", None),
    ("dsv4", "gb10x2", "192.168.100.10,192.168.100.11", GB10_IF, "native", None),
    ("dsv4", "gb10x2", "spark1,spark2", (), "docker", DSV4_DIR),
    ("dsv4", "gb10x4-ep4", FOUR, GB10_IF, "native", None),
    ("glm52", "gb10x6-ray", SIX, IF_CX7, "docker", None),
]


def _id(case: Case) -> str:
    return f"{case[0]}--{case[1]}--{case[4]}"


def rendering(
    recipe: str,
    variant: str,
    nodes: str,
    sets: tuple[str, ...],
    runtime: str,
    model_dir: str | None,
) -> dict[str, object]:
    request = PlanRequest(recipe=recipe, variants=(variant,), sets=sets, model_dir=model_dir)
    plan = resolve(request)
    docker = runtime == "docker"
    mounted = CONTAINER_MODEL_DIR if docker and plan.model_dir else None
    launches = render_nodes(plan, parse_nodes(nodes), container_model_dir=mounted)
    document: dict[str, object] = {
        "plan_hash": plan.plan_hash,
        "multinode": plan.multinode.model_dump() if plan.multinode else None,
        "nodes": [launch.as_dict() for launch in launches],
    }
    if docker:
        document["containers"] = [
            container_kwargs(
                StartRequest(
                    deployment=recipe,
                    run_id=f"{recipe}-run",
                    rank=launch.rank,
                    name=process.name,
                    argv=process.argv,
                    env=launch.env_for(process),
                    image=launch.image,
                    gpus=launch.gpus,
                    model_dir=plan.model_dir,
                    container_model_dir=mounted,
                    shm_size=plan.image.shm_size,
                )
            )
            for launch in launches
            for process in launch.processes
        ]
    return document


@pytest.mark.parametrize(
    ("recipe", "variant", "nodes", "sets", "runtime", "model_dir"), CASES, ids=map(_id, CASES)
)
def test_multinode_golden(
    recipe: str,
    variant: str,
    nodes: str,
    sets: tuple[str, ...],
    runtime: str,
    model_dir: str | None,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SM120_HOME", "/home/user/.local/state/sm120")
    path = GOLDEN / f"{recipe}--{variant}--{runtime}.json"
    document = rendering(recipe, variant, nodes, sets, runtime, model_dir)
    actual = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if request.config.getoption("--update-golden"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.is_file(), f"missing {path.name}: run pytest --update-golden"
    assert actual == path.read_text(), f"{path.name} changed: review, then --update-golden"


def test_every_declared_layout_has_a_golden_file() -> None:
    declared = {
        (name, variant)
        for name in recipe_names()
        for variant, spec in load_recipe(name).variants.items()
        if spec.multinode is not None
    }
    covered = {(recipe, variant) for recipe, variant, *_ in CASES}
    assert declared - covered == set()
