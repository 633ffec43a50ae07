"""Nine GPUs, a count that is not a power of two: the planner, placement, render and doctor
take it as they take 2, 4 or 8, and the refusals that remain are the engine's own (heads that
TP does not divide, DCP beyond what vLLM allows), each with the message the user sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.deploy import placement
from sm120.deploy.placement import PlacementError, check_gpus_exist, placed_hardware
from sm120.doctor.capture import read_captured
from sm120.doctor.p2p import P2PReport, StepResult
from sm120.doctor.p2p_gate import decide_p2p
from sm120.doctor.p2p_live import plan_gpus
from sm120.plan.hardware import Hardware, divisors
from sm120.plan.resolve import PlanRequest, resolve
from tests.helpers import DATA_DIR, invoke, one_line_error
from tests.plan.test_rules import SM120_X2, failed, results

NINE = Hardware(gpus=9, arch="sm_120", source="declared")
EIGHT = Hardware(gpus=8, arch="sm_120", source="declared")
ALL_NINE = ",".join(str(index) for index in range(9))
NINE_BOX = DATA_DIR / "nvidia_smi_constructed" / "rtx_pro_6000_9x_615"


def _status(recipe: str, rule_id: str, *sets: str, hardware: Hardware = NINE) -> str:
    return results(recipe, sets=sets, hardware=hardware)[rule_id].status  # type: ignore[attr-defined,no-any-return]


def test_divisors_of_odd_and_even_sizes() -> None:
    assert divisors(9) == [1, 3, 9]
    assert divisors(4) == [1, 2, 4]
    assert divisors(6) == [1, 2, 3, 6]


# --- S01: the hint names TP's own divisors ---------------------------------------------------


def test_s01_names_the_divisors_of_tp_9() -> None:
    message = failed("kimik3", "S01", "decode-context-parallel-size=2", hardware=NINE)
    assert message == (
        "tensor-parallel-size 9 is not divisible by decode-context-parallel-size 2; "
        "pick a DCP that divides TP (1, 3 or 9 for TP 9)"
    )


def test_s01_passes_dcp_3_at_tp_9_and_keeps_its_tp_4_text() -> None:
    assert _status("kimik3", "S01", "decode-context-parallel-size=3") == "pass"
    message = failed("glm52", "S01", "decode-context-parallel-size=3")
    assert message.endswith("pick a DCP that divides TP (1, 2 or 4 for TP 4)")


# --- S02: nine GPUs fit nine, not eight --------------------------------------------------------


def test_s02_nine_ranks_need_nine_gpus() -> None:
    assert _status("kimik3", "S02") == "pass"
    assert failed("kimik3", "S02", hardware=EIGHT) == (
        "TP x PP = 9 GPUs but 8x sm_120 (declared) has 8; lower tensor-parallel-size or "
        "pick a variant for fewer GPUs"
    )


# --- S10: heads over TP and DCP, as upstream vLLM checks them --------------------------------


def test_s10_refuses_tp_that_does_not_divide_the_heads_on_an_upstream_release() -> None:
    # glm47's GLM-4.7: 96 attention heads, 8 KV heads, on vLLM 0.15.1
    message = failed("glm47", "S10", "tensor-parallel-size=9", hardware=NINE)
    assert message == (
        "96 attention heads are not divisible by tensor-parallel-size 9: vLLM 0.15.1 refuses "
        "it at startup; use a TP that divides 96 (1, 2, 3, 4, 6 or 8)"
    )


def test_s10_refuses_tp_that_divides_the_heads_but_not_the_kv_heads() -> None:
    # 96 heads split over 6, the 8 KV heads do not (vLLM asserts it as the layers are built)
    message = failed("glm47", "S10", "tensor-parallel-size=6", hardware=NINE)
    assert message == (
        "the model's 8 KV heads do not split over tensor-parallel-size 6 (vLLM needs one to "
        "divide the other): the model fails to load; use a TP that divides 96 and divides or "
        "is a multiple of 8"
    )


def test_s10_passes_tps_that_split_heads_and_kv_heads() -> None:
    for tp in (1, 2, 4, 8):
        assert _status("glm47", "S10", f"tensor-parallel-size={tp}") == "pass", tp


def test_s10_refuses_gqa_dcp_that_vllm_refuses() -> None:
    # 8 KV heads at TP 4: vLLM wants TP above the KV heads before DCP may be used
    message = failed("glm47", "S10", "decode-context-parallel-size=2")
    assert message == (
        "decode-context-parallel-size 2 needs tensor-parallel-size above the model's 8 KV "
        "heads and DCP at most TP / KV heads (0 at TP 4): vLLM refuses it at startup; set "
        "decode-context-parallel-size=1"
    )


def test_s10_passes_mla_dcp_and_fork_builds() -> None:
    # MLA keeps one latent KV head: DCP may span TP (glm52's DCP 4 at TP 4)
    assert _status("glm52", "S10", "decode-context-parallel-size=4") == "pass"
    # a fork that shards heads unevenly is not judged (the Kimi-K3 image at TP 9)
    fork = ("tensor-parallel-size=9", "image.engine_version=dev/karmic-kraken")
    assert _status("glm47", "S10", *fork) == "pass"


# --- F35: custom all-reduce in graph capture at TP 2 (Qwen3.8-Flash-Next preview image) -------

PREVIEW = ("image.engine_version=0.1.dev20073+g8e685d198", "tensor-parallel-size=2")


def test_f40_custom_all_reduce_at_tp2_on_the_preview_image_is_refused() -> None:
    message = failed("qwen38flash", "F35", *PREVIEW, hardware=SM120_X2)
    assert message == (
        "vLLM 0.1.dev20073+g8e685d198's custom all-reduce fails during CUDA graph capture at "
        "TP 2 on sm_120 for Qwen3.8-Flash-Next (rtx6kpro models/qwen38-flash-next.md); use "
        "--set disable-custom-all-reduce=true (NCCL)"
    )


@pytest.mark.parametrize(
    "change",
    [
        "disable-custom-all-reduce=true",  # the fix
        "tensor-parallel-size=1",  # one GPU has no all-reduce
        "image.engine_version=0.32.0",  # another release: not confirmed there
        "image.engine_version=karmic-kraken-beta",  # the fork's own B12X PCIe all-reduce
        "enforce-eager=true",  # no CUDA graphs, nothing to capture
    ],
)
def test_f40_does_not_fire_where_it_does_not_hold(change: str) -> None:
    assert _status("qwen38flash", "F35", *PREVIEW, change, hardware=SM120_X2) == "pass"


def test_f40_guards_the_tp2_fp8_variant_that_drops_the_fix() -> None:
    assert _status("qwen38flash", "F35", hardware=SM120_X2) == "pass"  # TP 1 default
    checked = results("qwen38flash", "tp2-fp8", hardware=SM120_X2)
    assert checked["F35"].status == "pass"  # type: ignore[attr-defined]
    dropped = results(
        "qwen38flash", "tp2-fp8", sets=("disable-custom-all-reduce=false",), hardware=SM120_X2
    )
    assert dropped["F35"].status == "fail"  # type: ignore[attr-defined]


def test_f40_holds_on_sm120_only_and_for_this_model_only() -> None:
    h200 = Hardware(gpus=2, arch="sm_90", source="declared")
    assert _status("qwen38flash", "F35", *PREVIEW, hardware=h200) == "pass"
    gb10 = Hardware(gpus=2, arch="sm_121", source="declared")
    assert _status("qwen38flash", "F35", *PREVIEW, hardware=gb10) == "pass"
    other = ("model.repo=Qwen/Qwen3-32B", "model.architecture=Qwen3ForCausalLM")
    assert _status("qwen38flash", "F35", *PREVIEW, *other, hardware=SM120_X2) == "pass"


# --- placement and render on nine GPUs ---------------------------------------------------------


def test_placement_takes_all_nine_and_refuses_a_tenth(monkeypatch: pytest.MonkeyPatch) -> None:
    detected = Hardware(gpus=9, arch="sm_120", source="detected")
    monkeypatch.setattr(placement, "detect", lambda: detected)
    assert placed_hardware(tuple(range(9)), None) == detected
    with pytest.raises(PlacementError, match=r"names GPU 9, and this machine has GPUs 0-8"):
        check_gpus_exist(tuple(range(10)), 9)


def test_nine_gpus_render_natively_and_in_a_container(cli: CliRunner) -> None:
    base = ("launch", "kimik3", "--gpus", ALL_NINE, "--arch", "sm_120", "--dry-run", "--json")
    code, out, _ = invoke(cli, *base)
    assert code == 0, out
    assert json.loads(out)["env"]["CUDA_VISIBLE_DEVICES"] == ALL_NINE
    code, out, _ = invoke(cli, *base, "--runtime", "docker")
    assert code == 0, out
    requests = json.loads(out)["container"]["device_requests"]
    assert requests[0]["device_ids"] == [str(index) for index in range(9)]


def test_eight_placed_gpus_fail_the_count_rule_for_tp_9(cli: CliRunner) -> None:
    code, out, _ = invoke(
        cli, "launch", "kimik3", "--gpus", "0,1,2,3,4,5,6,7", "--arch", "sm_120", "--dry-run"
    )
    assert code == 1
    assert "FAIL   S02 TP x PP = 9 GPUs but 8x sm_120 (declared) has 8" in out


# --- doctor on a nine-GPU host -----------------------------------------------------------------


def test_doctor_reads_nine_gpus_and_their_36_pcie_pairs(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "doctor", "kimik3", "--from", str(NINE_BOX))
    assert code == 0, out
    assert "(9 GPU(s), read from the captured output)" in out
    assert "GPU8: NVIDIA RTX PRO 6000 Blackwell Workstation Edition, sm_120" in out
    assert "PCIe only (36 GPU pairs: SYS x20, NODE x16)" in out
    # only the link maxima were captured: no claim about the links as they are
    assert "pcie-links" not in out
    assert "nothing blocks" in out


# --- three nodes of three GPUs -----------------------------------------------------------------


def test_nine_ranks_over_three_nodes_of_three_gpus(cli: CliRunner) -> None:
    code, out, _ = invoke(
        cli,
        *("launch", "glm52", "-V", "gb10x6-ray", "--dry-run", "--arch", "sm_121", "--gpus", "3"),
        *("--nodes", "10.0.0.1,10.0.0.2,10.0.0.3"),
        *("--set", "multinode.nodes=3", "--set", "multinode.gpus_per_node=3"),
        *("--set", "multinode.tensor_parallel=9", "--set", "multinode.pipeline_parallel=1"),
    )
    assert "--tensor-parallel-size 9" in out
    assert out.count("--num-gpus=3 --block") == 3  # one head, two workers
    assert "node2 worker 10.0.0.3" in out
    assert "S02" not in [line.split()[1] for line in out.splitlines() if "FAIL" in line]
    assert code == 0, out


# --- the launch's P2P gate on nine GPUs --------------------------------------------------------


def test_the_p2p_gate_probes_all_nine_gpus_of_the_plan(tmp_path: Path) -> None:
    snapshot, _ = read_captured(NINE_BOX)
    assert snapshot.topology is not None and len(snapshot.topology.devices) == 9
    gpus = plan_gpus(resolve(PlanRequest(recipe="kimik3")))
    assert gpus == tuple(range(9))
    worlds: list[int] = []

    def probe() -> P2PReport:
        worlds.append(len(gpus))
        step = StepResult("copy GPU7->GPU8", False, 30.0, True, "no answer within 30 s (hung)")
        return P2PReport(world=9, backend="nccl", steps=[step])

    decision = decide_p2p(
        gpus=gpus,
        topology=snapshot.topology,
        plan_env={},
        boot_id="boot-1",
        probe=probe,
        cache_file=tmp_path / "p2p.json",
    )
    assert worlds == [9]
    assert decision.env == {"NCCL_P2P_DISABLE": "1"}


# --- sm120 plan's own refusals name the sizes that fit -----------------------------------------


def test_plan_names_the_head_counts_divisors_not_powers_of_two(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "plan", "tiny", "--gpus", "9", "--set", "tensor-parallel-size=3")
    assert (code, one_line_error(err)) == (
        2,
        "Error: tensor-parallel-size 3 does not divide the model's 4 attention heads "
        "(hint: use a TP that divides the head count (1, 2 or 4))",
    )


def test_plan_names_the_dcps_that_divide_tp_9(cli: CliRunner) -> None:
    code, _, err = invoke(
        cli, "plan", "kimik3", "--gpus", "9", "--kv-memory-gib", "20",
        "--set", "decode-context-parallel-size=2",
    )  # fmt: skip
    assert (code, one_line_error(err)) == (
        2,
        "Error: tensor-parallel-size 9 is not divisible by decode-context-parallel-size 2 "
        "(hint: pick a DCP that divides TP (1, 3 or 9 for TP 9))",
    )
