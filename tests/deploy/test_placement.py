"""launch --gpus: a count as before, or a GPU set the engine is pinned to; every way a
placement is refused, with its one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from sm120.deploy.monitoring import keep_launch_spec
from sm120.deploy.placement import PlacementError, check_no_overlap
from sm120.doctor import checks
from sm120.doctor.needs import needs_from_plan
from sm120.doctor.snapshot import Snapshot
from sm120.engine.runtime.base import LaunchSpec
from sm120.engine.runtime.processes import start_ticks
from sm120.engine.state import DeploymentState, save_state
from sm120.plan.gpu_sets import GpuChoice, GpuSetError, parse_gpus
from sm120.plan.resolve import PlanRequest, resolve
from tests.fakes.gpu_box import rtx
from tests.helpers import invoke, one_line_error

GPU_TINY = ("launch", "tiny", "-V", "gpu", "--arch", "sm_90")
HINT = (
    "(hint: a count (--gpus 4) or GPU indexes (--gpus 0,1 or --gpus device=3), as nvidia-smi "
    "numbers them)"
)


@pytest.mark.parametrize(
    ("text", "choice"),
    [
        ("4", GpuChoice(count=4)),
        ("0", GpuChoice(count=0)),
        ("0,1", GpuChoice(placement=(0, 1))),
        (" 2, 3 ", GpuChoice(placement=(2, 3))),
        ("device=3", GpuChoice(placement=(3,))),
        ("device=1,0", GpuChoice(placement=(1, 0))),
    ],
)
def test_gpus_is_a_count_or_a_set(text: str, choice: GpuChoice) -> None:
    assert parse_gpus(text) == choice


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("two", "Error: --gpus 'two' is not a count or a list of GPUs"),
        ("0,,1", "Error: --gpus '0,,1': '' is not a GPU index"),
        ("0,x", "Error: --gpus '0,x': 'x' is not a GPU index"),
        ("1,1", "Error: --gpus '1,1' names GPU 1 twice"),
        ("0,64", "Error: --gpus '0,64': GPU 64 is beyond 63"),
        ("device=", "Error: --gpus 'device=': '' is not a GPU index"),
    ],
)
def test_bad_gpu_sets(cli: CliRunner, value: str, message: str) -> None:
    code, out, err = invoke(cli, *GPU_TINY, "--dry-run", "--gpus", value)
    assert (code, out, one_line_error(err)) == (2, "", f"{message} {HINT}")


def test_a_count_keeps_its_range_check(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", "--gpus", "-1")
    assert (code, one_line_error(err)) == (
        2,
        "Error: --gpus must be 0 or more, got -1 (hint: 0 for a CPU-only machine, e.g. --gpus 4)",
    )


def test_a_cpu_recipe_has_nothing_to_place(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", "--arch", "sm_90", "--gpus", "0,1")
    assert (code, one_line_error(err)) == (
        2,
        "Error: tiny runs on the CPU: --gpus 0,1 has nothing to place (hint: leave --gpus out, "
        "or pick a GPU variant (sm120 recipes show NAME))",
    )


def test_gpus_this_machine_lacks_are_refused(cli: CliRunner) -> None:
    if checks_have_gpus():
        pytest.skip("this machine has GPUs: the no-GPU message is for machines without")
    code, _, err = invoke(cli, "launch", "tiny", "-V", "gpu", "--gpus", "0,1")
    assert (code, one_line_error(err)) == (
        2,
        "Error: --gpus names GPU 0,1, and this machine has no GPU "
        "(hint: see 'nvidia-smi -L' for the GPUs there are)",
    )


def checks_have_gpus() -> bool:
    from sm120.doctor.detect import detect

    return detect() is not None


def test_the_plan_is_pinned_natively_and_in_a_container(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, *GPU_TINY, "--gpus", "2,3", "--dry-run", "--json")
    assert code == 0
    assert json.loads(out)["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    code, out, _ = invoke(
        cli, *GPU_TINY, "--gpus", "2,3", "--dry-run", "--json", "--runtime", "docker"
    )
    container = json.loads(out)["container"]
    assert container["device_requests"] == [
        {"driver": "nvidia", "device_ids": ["2", "3"], "capabilities": [["gpu"]]}
    ]
    # Inside, the two GPUs are numbered 0 and 1: the host's numbers would point nowhere.
    assert "CUDA_VISIBLE_DEVICES" not in container["environment"]


def test_a_placement_with_too_few_gpus_fails_the_gpu_count_rule(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "launch", "glm52", "--gpus", "0,1", "--arch", "sm_120", "--dry-run")
    assert code == 1
    assert "FAIL   S02 TP x PP = 4 GPUs but 2x sm_120 (declared) has 2" in out


def test_the_memory_check_reads_the_placed_gpus() -> None:
    """Preflight's memory check (what refuses a launch that will not fit, naming the memory)
    looks at the GPUs the engine is placed on, not the first ones."""
    snap = Snapshot(source="nvidia-smi", gpus=[rtx(0), rtx(1), rtx(2, used=90000)])
    plan = resolve(
        PlanRequest(recipe="tiny", variants=("gpu",), sets=("env.CUDA_VISIBLE_DEVICES=2",))
    )
    wanted = needs_from_plan(plan)
    found = checks.check_gpu_memory(snap, wanted)
    assert [(f.id, f.severity) for f in found] == [("gpu2-memory", "error")]
    assert found[0].message.startswith("GPU2 has 7,887 MiB free of 97,887 MiB; tiny asks vLLM")


@pytest.fixture
def running_on_gpus_0_1() -> Iterator[None]:
    """A deployment 'a' that runs now (a real process group of ours) pinned to GPUs 0,1."""
    leader = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    time.sleep(0.1)
    try:
        save_state(
            DeploymentState(
                name="a",
                recipe="tiny",
                runtime="native",
                supervisor_pid=leader.pid,
                supervisor_start=start_ticks(leader.pid),
                engine_pid=None,
                host="127.0.0.1",
                port=8001,
                plan_hash="h",
                started_at=time.time(),
                log_path="/x/serve.log",
                exit_file="/nonexistent/exit.json",
                served_model_name="a",
                model_dir=None,
                api_key_file=None,
            )
        )
        keep_launch_spec(
            LaunchSpec(
                name="a",
                recipe="tiny",
                argv=("vllm",),
                env={"CUDA_VISIBLE_DEVICES": "0,1"},
                host="127.0.0.1",
                port=8001,
                plan_hash="h",
                served_model_name="a",
                model_dir=None,
                api_key_file=None,
            )
        )
        yield
    finally:
        leader.kill()
        leader.wait()


def test_overlapping_a_running_deployment_is_refused(running_on_gpus_0_1: None) -> None:
    with pytest.raises(PlacementError) as refused:
        check_no_overlap((1, 2), "b")
    assert refused.value.one_line() == (
        "GPU 1 is in use by deployment 'a' (GPUs 0,1) "
        "(hint: pick other GPUs with --gpus, or stop it: sm120 stop a)"
    )
    check_no_overlap((2, 3), "b")  # disjoint: fine
    check_no_overlap((0, 1), "a")  # the deployment itself (being replaced): fine


def test_the_launch_refuses_an_overlap_before_anything_starts(
    cli: CliRunner, running_on_gpus_0_1: None
) -> None:
    code, _, err = invoke(cli, *GPU_TINY, "--gpus", "device=1", "--name", "b", "--no-monitor")
    assert (code, one_line_error(err)) == (
        2,
        "Error: GPU 1 is in use by deployment 'a' (GPUs 0,1) "
        "(hint: pick other GPUs with --gpus, or stop it: sm120 stop a)",
    )


def test_gpu_set_errors_are_one_line_library_errors() -> None:
    with pytest.raises(GpuSetError):
        parse_gpus("0,a")
