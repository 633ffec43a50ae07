"""The engine bugs users hit now (issue 37) as plan rules: each trips with the message the
user sees, and each stays quiet outside the engine releases and hardware it holds for."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sm120.plan.hardware import Hardware
from tests.helpers import invoke
from tests.plan.test_rules import SM120_X2, failed, results

GB10_X2 = Hardware(gpus=2, arch="sm_121", source="declared")
PRO_6000D_X4 = Hardware(
    gpus=4, arch="sm_120", source="detected", names=("NVIDIA RTX PRO 6000D",) * 4
)

DSV41 = (
    "model.repo=deepseek-ai/DeepSeek-V4.1-Flash",
    "model.architecture=DeepseekV41ForCausalLM",
)


def _status(found: dict[str, object], rule_id: str) -> str:
    return found[rule_id].status  # type: ignore[attr-defined,no-any-return]


# --- F30: DeepSeek-V4.1 has no SM120 sparse-MLA decode kernel (vllm#56837) ----------------


def test_f30_dsv41_on_an_upstream_release_is_refused() -> None:
    message = failed("dsv4", "F30", *DSV41, "image.engine_version=0.29.1", hardware=SM120_X2)
    assert message == (
        "vLLM 0.29.1 has no sm_120 sparse-MLA decode kernel for DeepSeek-V4.1's shape (64 "
        "heads, top-k 1152; vllm#56837): the engine dies in its warm-up; use an image whose "
        "recipe ships SM120 kernels for it, or the dsv4 recipe"
    )


@pytest.mark.parametrize(
    "version", ["0.28.2", "sm120-pr-41834-stable-preview-20260626", "dev/karmic-kraken"]
)
def test_f30_passes_before_0_29_and_on_fork_builds(version: str) -> None:
    sets = (*DSV41, f"image.engine_version={version}")
    assert _status(results("dsv4", sets=sets, hardware=SM120_X2), "F30") == "pass"


def test_f30_passes_for_deepseek_v4_flash_and_off_sm12x() -> None:
    version = ("image.engine_version=0.29.1",)
    assert _status(results("dsv4", sets=version, hardware=SM120_X2), "F30") == "pass"
    h200 = Hardware(gpus=2, arch="sm_90", source="declared")
    assert _status(results("dsv4", sets=(*DSV41, *version), hardware=h200), "F30") == "pass"


# --- F31: -0731 + DSpark under DP + EP (vllm#56281) -----------------------------------------

DSPARK_DP_EP = (
    "model.repo=deepseek-ai/DeepSeek-V4-Flash-0731",
    'speculative-config={"method": "dspark", "num_speculative_tokens": 5}',
    "data-parallel-size=2",
    "enable-expert-parallel=true",
    "image.engine_version=0.29.0",
)


def test_f31_dspark_under_dp_and_ep_is_refused() -> None:
    message = failed(
        "dsv4",
        "F31",
        *DSPARK_DP_EP,
        hardware=Hardware(4, "sm_120", "declared"),
        variants=("pr41834",),
    )
    assert message == (
        "DeepSeek-V4-Flash-0731 with DSpark under data parallel + expert parallel fails its "
        "profile run (assert num_tokens_across_dp_cpu[dp_rank] == batchsize; vllm#56281); "
        "use --set data-parallel-size=1 (tensor parallel alone), or MTP"
    )


@pytest.mark.parametrize(
    "change",
    [
        "data-parallel-size=1",
        "enable-expert-parallel=false",
        'speculative-config={"method": "mtp", "num_speculative_tokens": 2}',
        "model.repo=deepseek-ai/DeepSeek-V4-Flash",
        "image.engine_version=0.27.0",
    ],
)
def test_f31_each_condition_is_needed(change: str) -> None:
    found = results(
        "dsv4",
        "pr41834",
        sets=(*DSPARK_DP_EP, change),
        hardware=Hardware(4, "sm_120", "declared"),
    )
    assert _status(found, "F31") == "pass"


# --- F32: GLM-5.2 NVFP4 garbled on GB10 and RTX PRO 6000D (vllm#49886) ----------------------

UPSTREAM_GLM52 = ("image.engine_version=0.26.0", "attention-backend=FLASHINFER_MLA_SPARSE_SM120")


def test_f32_glm52_nvfp4_on_rtx_pro_6000d_is_refused() -> None:
    message = failed("glm52", "F32", *UPSTREAM_GLM52, hardware=PRO_6000D_X4)
    assert message == (
        "GLM-5.2 NVFP4 on RTX PRO 6000D through FLASHINFER_MLA_SPARSE_SM120 serves garbled "
        "text (vllm#49886, open): no known fix there; on RTX PRO 6000 use the glm52 recipe's "
        "b12x image with --set attention-backend=B12X_MLA_SPARSE"
    )


def test_f32_glm52_nvfp4_on_gb10_is_refused() -> None:
    gb10 = Hardware(gpus=4, arch="sm_121", source="declared")
    assert "on GB10 (sm_121) through" in failed(
        "glm52", "F32", *UPSTREAM_GLM52, "hardware.compute_caps=[sm_120, sm_121]", hardware=gb10
    )


def test_f32_passes_on_rtx_pro_6000_and_with_the_b12x_backend() -> None:
    assert _status(results("glm52", sets=UPSTREAM_GLM52), "F32") == "pass"
    # the recipe's own b12x image and B12X_MLA_SPARSE backend: another kernel path
    assert _status(results("glm52", hardware=PRO_6000D_X4), "F32") == "pass"


def test_f32_passes_on_the_gb10_seed_variant_fork_build() -> None:
    # seed 001 served GLM-5.2 NVFP4 on 6x GB10 with the PR #41834 branch: not upstream 0.26
    gb10 = Hardware(gpus=1, arch="sm_121", source="declared")
    assert _status(results("glm52", "gb10x6-ray", hardware=gb10), "F32") == "pass"


def test_f32_passes_before_vllm_0_26() -> None:
    sets = ("image.engine_version=0.25.1", UPSTREAM_GLM52[1])
    assert _status(results("glm52", sets=sets, hardware=PRO_6000D_X4), "F32") == "pass"


# --- F33: SGLang's FlashMLA sparse prefill on by default (sglang#31578) ---------------------


def test_f33_sglang_release_with_the_default_is_refused() -> None:
    message = failed(
        "dsv4", "F33", "image.engine_version=0.5.16", variants=("sglang",), hardware=SM120_X2
    )
    assert message == (
        "SGLang 0.5.16 turns FlashMLA sparse prefill on by default and it has no sm_120 "
        "kernel (sglang#31578): set --set env.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=0"
    )


@pytest.mark.parametrize(
    "sets",
    [
        ("image.engine_version=0.5.16", "env.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL=0"),
        ("image.engine_version=0.5.14",),
        # the seed variant's name-only tag (2026-04, before the flip) is not judged
        (),
    ],
)
def test_f33_passes_when_off_before_the_flip_and_on_the_seed_tag(sets: tuple[str, ...]) -> None:
    found = results("dsv4", "sglang", sets=sets, hardware=SM120_X2)
    assert _status(found, "F33") == "pass"


def test_launch_refuses_the_broken_configuration_with_reason_and_fix(cli: CliRunner) -> None:
    sets = [arg for value in DSPARK_DP_EP for arg in ("--set", value)]
    code, out, err = invoke(
        cli, "launch", "dsv4", "-V", "pr41834", "--dry-run", "--gpus", "4", *sets
    )
    assert code == 1
    flat = " ".join((out + err).split())
    # the engine's own assertion text survives the terminal markup
    assert (
        "FAIL F31 DeepSeek-V4-Flash-0731 with DSpark under data parallel + expert parallel "
        "fails its profile run (assert num_tokens_across_dp_cpu[dp_rank] == batchsize; "
        "vllm#56281); use --set data-parallel-size=1 (tensor parallel alone), or MTP"
    ) in flat
