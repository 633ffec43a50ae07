"""Every rule trips, with the message the user sees."""

from __future__ import annotations

import pytest

from sm120.plan.hardware import Hardware
from tests.helpers import SM120_X4, plan_for

SM120_X2 = Hardware(gpus=2, arch="sm_120", source="declared")


def results(
    recipe: str,
    *variants: str,
    sets: tuple[str, ...] = (),
    hardware: Hardware | None = SM120_X4,
    **kwargs: object,
) -> dict[str, object]:
    checked = plan_for(recipe, *variants, sets=sets, hardware=hardware, **kwargs)  # type: ignore[arg-type]
    return {r.id: r for r in checked.results}


def failed(
    recipe: str,
    rule_id: str,
    *sets: str,
    hardware: Hardware | None = SM120_X4,
    variants: tuple[str, ...] = (),
) -> str:
    result = results(recipe, *variants, sets=sets, hardware=hardware)[rule_id]
    assert result.status == "fail", result  # type: ignore[attr-defined]
    return " ".join(result.messages)  # type: ignore[attr-defined]


@pytest.mark.parametrize("recipe", ["glm47", "glm52", "dsv4"])
def test_seed_recipes_pass_every_error_rule_on_their_hardware(recipe: str) -> None:
    assert [r for r in results(recipe).values() if r.status == "fail"] == []  # type: ignore[attr-defined]


def test_s01_tp_divisible_by_dcp() -> None:
    assert "not divisible by decode-context-parallel-size 3" in failed(
        "glm52", "S01", "decode-context-parallel-size=3"
    )


def test_s02_tp_fits_gpus() -> None:
    assert "TP x PP = 4 GPUs but 2x sm_120 (declared) has 2" in failed(
        "glm52", "S02", hardware=SM120_X2
    )


def test_s03_port_range() -> None:
    checked = plan_for("glm47", port=70000, hardware=SM120_X4)
    assert {r.id: r.status for r in checked.results}["S03"] == "fail"


def test_s04_positive_lengths() -> None:
    assert "max-model-len must be at least 1, got 0" in failed("glm47", "S04", "max-model-len=0")


def test_s04_negative_tensor_parallel() -> None:
    assert "tensor-parallel-size must be at least 1, got -2" in failed(
        "glm47", "S04", "tensor-parallel-size=-2"
    )


def test_smoke_budget_must_be_positive() -> None:
    from sm120.core.errors import PlanError

    with pytest.raises(PlanError, match=r"smoke\.max_tokens: Input should be greater than 0"):
        plan_for("glm47", sets=("smoke.max_tokens=0",))


def test_s05_memory_fraction() -> None:
    assert "gpu-memory-utilization must be in (0, 1], got 1.5" in failed(
        "glm47", "S05", "gpu-memory-utilization=1.5"
    )


def test_s06_unvalidated_hardware() -> None:
    message = failed("glm47", "S06", hardware=Hardware(4, "sm_90", "declared"))
    assert "validated on sm_120, this is 4x sm_90" in message


def test_s06_assumed_hardware_is_not_judged() -> None:
    assert results("glm47", hardware=None)["S06"].status == "pass"  # type: ignore[attr-defined]


def test_s07_unknown_kv_dtype() -> None:
    assert "'fp9' is not a known kv-cache-dtype; did you mean 'fp8'?" in failed(
        "glm47", "S07", "kv-cache-dtype=fp9"
    )


def test_f02_lowercase_backend_name() -> None:
    message = failed("glm47", "F02", "attention-backend=triton")
    assert "unknown attention backend 'triton'; did you mean 'TRITON_ATTN'?" in message


def test_f01_flashinfer_on_sm120_with_vllm_015() -> None:
    # the 0.15.1 image is a variant's since glm47's default moved to vLLM 0.16.0
    assert "use --set attention-backend=TRITON_ATTN" in failed(
        "glm47", "F01", "attention-backend=FLASHINFER", variants=("seed-pinned",)
    )
    assert results("glm47", sets=("attention-backend=FLASHINFER",))["F01"].status == "pass"  # type: ignore[attr-defined]


def test_f01_holds_on_vllm_015_only() -> None:
    # failures.yaml scopes F01 to vllm ==0.15.*: a newer engine is not blocked by the old bug
    newer = results("glm47", sets=("attention-backend=FLASHINFER", "image.engine_version=0.32.0"))
    assert newer["F01"].status == "pass"  # type: ignore[attr-defined]
    older = results("glm47", sets=("attention-backend=FLASHINFER", "image.engine_version=v0.15.0"))
    assert older["F01"].status == "fail"  # type: ignore[attr-defined]


def test_f29_glm47_nvfp4_k_v_scales_on_vllm_023() -> None:
    message = failed("glm47", "F29", "image.engine_version=0.23.1rc1.dev448")
    assert message == (
        "vLLM 0.23.1rc1.dev448 fails to load this NVFP4 checkpoint's k/v scales "
        "(KVCacheScaleParameter.weight_loader() takes 2 positional arguments but 3 were "
        "given); serve it on the recipe's vLLM 0.15.1 image or one with the loader fix"
    )


@pytest.mark.parametrize("version", ["0.15.1", "0.22.2", "0.24.0"])
def test_f29_does_not_hold_outside_vllm_023(version: str) -> None:
    found = results("glm47", sets=(f"image.engine_version={version}",))
    assert found["F29"].status == "pass"  # type: ignore[attr-defined]


def test_f29_holds_on_a_fork_ref_without_a_release_number() -> None:
    # a branch or fork ref has no release order: the rule cannot rule the failure out
    assert "KVCacheScaleParameter" in failed("glm47", "F29", "image.engine_version=dev/glm-fix")


def test_f29_only_guards_the_glm4_moe_nvfp4_checkpoint() -> None:
    found = results("glm52", sets=("image.engine_version=0.23.1",))
    assert found["F29"].status == "pass"  # type: ignore[attr-defined]


def test_f07_nvfp4_kv_cache() -> None:
    assert "kv-cache-dtype nvfp4 has no sm_120 kernel" in failed(
        "glm47", "F07", "kv-cache-dtype=nvfp4"
    )


def test_f07_does_not_apply_off_sm12x() -> None:
    hw = Hardware(4, "sm_100", "declared")
    assert results("glm47", sets=("kv-cache-dtype=nvfp4",), hardware=hw)["F07"].status == "pass"  # type: ignore[attr-defined]


FORK_REF = "DSpark fork + danielwoz/vllm-dspark-nvfp4 c633834"


def test_f07_and_f14_pass_the_forks_own_4bit_kv_on_its_ref() -> None:
    # dsv4 -V nvfp4-kv: danielwoz's build implements nvfp4_ds_mla for SM120 itself
    found = results("dsv4", "nvfp4-kv", hardware=SM120_X2)
    assert found["F07"].status == "pass"  # type: ignore[attr-defined]
    assert found["F14"].status == "pass"  # type: ignore[attr-defined]
    assert resolve_ref("dsv4", "nvfp4-kv") == FORK_REF


def test_f07_still_refuses_nvfp4_ds_mla_on_any_other_engine_ref() -> None:
    # the same dtype on the PR #41834 build (the default) or a hand-edited ref: no kernel
    assert failed("dsv4", "F07", "kv-cache-dtype=nvfp4_ds_mla", hardware=SM120_X2) == (
        "kv-cache-dtype nvfp4_ds_mla has no sm_120 kernel (the engine dies on the first "
        "request); use --set kv-cache-dtype=fp8"
    )
    assert "kv-cache-dtype nvfp4_ds_mla has no sm_120 kernel" in failed(
        "dsv4",
        "F07",
        f"image.engine_version={FORK_REF} (rebuilt)",
        hardware=SM120_X2,
        variants=("nvfp4-kv",),
    )


def test_f07_and_f14_still_refuse_plain_nvfp4_on_the_forks_ref() -> None:
    # the fork adds nvfp4_ds_mla only; FlashInfer's plain nvfp4 path is the one F07 is about
    assert "kv-cache-dtype nvfp4 has no sm_120 kernel" in failed(
        "dsv4", "F07", "kv-cache-dtype=nvfp4", hardware=SM120_X2, variants=("nvfp4-kv",)
    )
    assert failed(
        "dsv4", "F14", "kv-cache-dtype=nvfp4", hardware=SM120_X2, variants=("nvfp4-kv",)
    ) == (
        "DeepSeek-V4 fails at model construction with kv-cache-dtype nvfp4; its fp8_ds_mla "
        "layout needs --set kv-cache-dtype=fp8"
    )


def test_f07_and_f11_pass_gilded_gnosis_own_nvfp4_mla_kv_on_its_ref_only() -> None:
    # glm52 -V exl3-tp4: the r18 EXL3 preset's own KV; the default's b12x build has no kernel
    found = results("glm52", "exl3-tp4")
    assert (found["F07"].status, found["F11"].status) == ("pass", "pass")  # type: ignore[attr-defined]
    assert "kv-cache-dtype nvfp4_ds_mla on the SM120 sparse-MLA path produces garbage" in failed(
        "glm52", "F11", "kv-cache-dtype=nvfp4_ds_mla"
    )


def resolve_ref(recipe: str, *variants: str) -> str:
    return plan_for(recipe, *variants, hardware=SM120_X2).plan.image.engine_version


def test_f11_bf16_kv_on_sparse_mla() -> None:
    assert "produces garbage output" in failed("glm52", "F11", "kv-cache-dtype=bfloat16")


def test_f13_fp4_indexer_cache() -> None:
    message = failed(
        "dsv4", "F13", 'attention-config={"use_fp4_indexer_cache": true}', hardware=SM120_X2
    )
    assert "SM100-only" in message


def test_f14_dsv4_needs_fp8() -> None:
    assert "kv-cache-dtype auto" in failed("dsv4", "F14", "kv-cache-dtype=auto", hardware=SM120_X2)


def test_f17_invented_variable() -> None:
    message = failed(
        "dsv4", "F17", "env.VLLM_SM120_REFERENCE_TOPK_CHUNK_SIZE=256", hardware=SM120_X2
    )
    assert "VLLM_TRITON_MLA_SPARSE_TOPK_CHUNK_SIZE" in message


def test_f17_removed_attention_backend_variable() -> None:
    assert "VLLM_ATTENTION_BACKEND" in failed(
        "dsv4", "F17", "env.VLLM_ATTENTION_BACKEND=FLASH_ATTN_2", hardware=SM120_X2
    )


def test_f17_unknown_variable_with_suggestion() -> None:
    message = failed("glm47", "F17", "env.VLLM_CPU_KVCACHE_SPAC=1")
    assert "not read by the upstream engine build" in message
    assert "did you mean 'VLLM_CPU_KVCACHE_SPACE'?" in message


def test_f17_allow_list_is_per_image() -> None:
    # The b12x knob is real in the glm52 image but means nothing to upstream 0.15.1.
    assert results("glm52")["F17"].status == "pass"  # type: ignore[attr-defined]
    assert "VLLM_USE_B12X_MOE" in failed("glm47", "F17", "env.VLLM_USE_B12X_MOE=1")


def test_f09_pattern_removed() -> None:
    message = failed("glm52", "F09", "derive.index_topk_pattern=false")
    assert "vLLM ignores indexer_types" in message


def test_warnings_do_not_fail() -> None:
    found = results("glm52", sets=("env.NCCL_P2P_DISABLE=0", "smoke.max_tokens=64"))
    assert found["F10"].status == "warn"  # type: ignore[attr-defined]
    assert found["F12"].status == "warn"  # type: ignore[attr-defined]


def test_f16_warns_without_cudagraph_variable() -> None:
    found = results(
        "dsv4", sets=("env.VLLM_TRITON_MLA_SPARSE_ALLOW_CUDAGRAPH=null",), hardware=SM120_X2
    )
    assert found["F16"].status == "warn"  # type: ignore[attr-defined]


def test_force_skips_a_rule_and_changes_the_hash() -> None:
    plain = plan_for("glm47", sets=("attention-backend=triton",), hardware=SM120_X4)
    forced = plan_for(
        "glm47", sets=("attention-backend=triton",), hardware=SM120_X4, force=("F02",)
    )
    assert {r.id: r.status for r in forced.results}["F02"] == "forced"
    assert forced.plan.forced == ("F02",)
    assert forced.plan.plan_hash != plain.plan.plan_hash
    assert not forced.failed


def test_unknown_force_id() -> None:
    from sm120.core.errors import PlanError

    with pytest.raises(PlanError, match="unknown rule 'f02'; did you mean 'F02'"):
        plan_for("glm47", force=("f02",))


def test_f05b_mtp_with_a_glm_tool_parser_warns() -> None:
    # glm52's default serves MTP with the glm47 tool parser
    found = results("glm52")["F05b"]
    assert found.status == "warn"  # type: ignore[attr-defined]
    assert "MTP drafts with the glm47 tool parser on vLLM" in " ".join(found.messages)  # type: ignore[attr-defined]


def test_f05b_is_silent_without_mtp_or_on_an_older_release() -> None:
    assert results("glm47")["F05b"].status == "pass"  # type: ignore[attr-defined]
    older = results("glm52", sets=("image.engine_version=0.11.0",))
    assert older["F05b"].status == "pass"  # type: ignore[attr-defined]
