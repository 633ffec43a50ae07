"""Multi-node layouts in recipes and plans: the flags a layout stands for, and every rule that
rejects a layout, with its exact message."""

from __future__ import annotations

import pytest

from sm120.core.errors import PlanError
from sm120.plan.resolve import PlanRequest, resolve
from sm120.recipe.catalogue import engine_flags
from sm120.render.argv import render_argv
from tests.helpers import flag_value


def plan(recipe: str, *variants: str, sets: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    return resolve(PlanRequest(recipe=recipe, variants=variants, sets=sets))


def error(recipe: str, *variants: str, sets: tuple[str, ...] = ()) -> str:
    with pytest.raises(PlanError) as caught:
        plan(recipe, *variants, sets=sets)
    return caught.value.one_line()


def test_native_layout_sets_tp_and_the_mp_executor() -> None:
    resolved = plan("dsv4", "gb10x2")
    argv = render_argv(resolved)
    assert flag_value(argv, "--tensor-parallel-size") == "2"
    assert flag_value(argv, "--distributed-executor-backend") == "mp"
    assert "--pipeline-parallel-size" not in argv
    assert "--enable-expert-parallel" not in argv
    assert resolved.provenance["args.tensor-parallel-size"] == "multinode layout"
    assert resolved.multinode is not None
    assert resolved.multinode.nccl_version == "2.30.7"


def test_expert_parallel_layout_renders_the_ep_switch() -> None:
    argv = render_argv(plan("dsv4", "gb10x4-ep4"))
    assert flag_value(argv, "--tensor-parallel-size") == "4"
    assert flag_value(argv, "--enable-expert-parallel") == ""


def test_ray_layout_sets_tp_pp_and_the_ray_executor() -> None:
    argv = render_argv(plan("glm52", "gb10x6-ray"))
    assert flag_value(argv, "--tensor-parallel-size") == "2"
    assert flag_value(argv, "--pipeline-parallel-size") == "3"
    assert flag_value(argv, "--distributed-executor-backend") == "ray"
    # replace_args dropped the single-box DCP 4 of the default
    assert "--decode-context-parallel-size" not in argv


def test_single_host_plans_have_no_layout_and_keep_their_hash() -> None:
    resolved = plan("dsv4")
    assert resolved.multinode is None
    assert "--distributed-executor-backend" not in render_argv(resolved)


def test_layout_is_part_of_the_plan_hash() -> None:
    base = plan("tiny", "2node")
    other = plan("tiny", "2node", sets=("multinode.master_port=30000",))
    assert base.plan_hash != other.plan_hash


def test_set_reaches_into_the_layout() -> None:
    resolved = plan("tiny", "2node", sets=("multinode.socket_ifname=mn0",))
    assert resolved.multinode is not None
    assert resolved.multinode.socket_ifname == "mn0"
    assert resolved.provenance["multinode.socket_ifname"] == "command line"


def test_changing_tp_in_the_layout_renders_it() -> None:
    resolved = plan(
        "tiny", "2node", sets=("multinode.tensor_parallel=1", "multinode.pipeline_parallel=2")
    )
    argv = render_argv(resolved)
    assert flag_value(argv, "--tensor-parallel-size") == "1"
    assert flag_value(argv, "--pipeline-parallel-size") == "2"


def test_uneven_split_is_refused() -> None:
    assert error("tiny", "2node", sets=("multinode.tensor_parallel=3",)) == (
        "multinode: TP 3 x PP 1 = 3 ranks do not split evenly over 2 nodes (hint: every node "
        "runs world size / nodes ranks; change tensor_parallel, pipeline_parallel or nodes)"
    )


def test_ranks_must_match_the_gpus() -> None:
    assert error("dsv4", "gb10x2", sets=("multinode.tensor_parallel=4",)) == (
        "multinode: TP 4 x PP 1 = 4 ranks but 2 nodes x 1 GPUs = 2 GPUs (hint: one rank per "
        "GPU: make TP x PP equal nodes x gpus_per_node)"
    )


def test_expert_parallel_must_be_off_or_tp() -> None:
    assert error("dsv4", "gb10x4-ep4", sets=("multinode.expert_parallel=2",)) == (
        "multinode: expert_parallel 2 must be 1 or equal tensor_parallel 4 (hint: vLLM spreads "
        "experts over the tensor-parallel ranks (--enable-expert-parallel))"
    )


def test_a_command_line_tp_that_contradicts_the_layout_is_refused() -> None:
    assert error("tiny", "2node", sets=("tensor-parallel-size=4",)) == (
        "tensor-parallel-size=4 (command line) conflicts with the multi-node layout (hint: "
        "change the layout instead, e.g. --set multinode.tensor_parallel=4)"
    )


def test_a_command_line_tp_that_agrees_with_the_layout_is_fine() -> None:
    assert plan("tiny", "2node", sets=("tensor-parallel-size=2",)).arg("tensor-parallel-size") == 2


def test_layout_key_without_a_layout_is_refused() -> None:
    assert error("tiny", sets=("multinode.nodes=2",)) == (
        "--set multinode.nodes=2: the plan has no multi-node layout (hint: pick a multi-node "
        "variant first (sm120 recipes show NAME lists them))"
    )


def test_unknown_layout_key_suggests_the_right_one() -> None:
    assert error("tiny", "2node", sets=("multinode.socket_ifnam=eth0",)) == (
        "--set: unknown recipe key 'multinode.socket_ifnam'; did you mean "
        "'multinode.socket_ifname'? (hint: see recipes/recipe.schema.json for the keys)"
    )


def test_bad_layout_value_names_the_field() -> None:
    assert error("tiny", "2node", sets=("multinode.nodes=1",)).startswith(
        "multinode.nodes: Input should be greater than or equal to 2"
    )


def test_multinode_needs_vllm() -> None:
    assert error("dsv4", "gb10x2", "sglang") == (
        "multinode: the layout needs vLLM's distributed executor, not sglang (hint: serve it "
        "on one host, or pick a vLLM variant)"
    )


@pytest.mark.parametrize("flag", ["nnodes", "node-rank", "master-addr", "master-port", "headless"])
def test_per_node_flags_are_reserved(flag: str) -> None:
    assert flag in engine_flags("vllm").reserved
    assert error("tiny", sets=(f"{flag}=1",)) == (
        f"'{flag}' is set by sm120 itself, not by a recipe flag (hint: multi-node flags come "
        "from the recipe's multinode layout and --nodes)"
    )


def test_unknown_executor_backend_is_a_rule_failure() -> None:
    from sm120.plan.hardware import Hardware
    from sm120.plan.rules import evaluate, failures

    resolved = plan("tiny", sets=("distributed-executor-backend=rayy",))
    failed = failures(evaluate(resolved, Hardware(0, "cpu", "declared")))
    assert [r.id for r in failed] == ["S07"]
    assert failed[0].messages == (
        "'rayy' is not a known distributed-executor-backend; did you mean 'ray'? for the cpu "
        "engine build",
    )


def test_fits_gpus_counts_per_node_for_layouts() -> None:
    from sm120.plan.hardware import Hardware
    from sm120.plan.rules import evaluate, failures

    one_gpu = Hardware(1, "sm_121", "declared")
    assert failures(evaluate(plan("dsv4", "gb10x2"), one_gpu)) == []
    # The seed default is the single-host plan validated on GB10 too (the default is SM120 only).
    assert [r.id for r in failures(evaluate(plan("dsv4", "seed"), one_gpu))] == ["S02"]
