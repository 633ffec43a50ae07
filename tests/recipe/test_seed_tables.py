"""Each seed recipe renders every flag, variable and value of its seed's tables: one test
per table row."""

from __future__ import annotations

import pytest

from sm120.render.environment import render_env
from tests.helpers import argv_of, flag_value, json_flag, plan_for

# seed 000 "Flags Required for SM120 and Why" + the serve script's variables
GLM47_ROWS = [
    ("--attention-backend", "TRITON_ATTN"),
    ("--gpu-memory-utilization", "0.8"),
    ("--quantization", "modelopt_fp4"),
    ("--dtype", "bfloat16"),
    ("--tensor-parallel-size", "4"),
    ("--trust-remote-code", ""),
    ("--tool-call-parser", "glm47"),
    ("--enable-auto-tool-choice", ""),
]


@pytest.mark.parametrize(("flag", "value"), GLM47_ROWS)
def test_glm47_seed_row(flag: str, value: str) -> None:
    assert flag_value(argv_of("glm47"), flag) == value


def test_glm47_offline_hub_and_pinned_snapshot() -> None:
    plan = plan_for("glm47").plan
    assert render_env(plan)["HF_HUB_OFFLINE"] == "1"
    argv = argv_of("glm47")
    assert flag_value(argv, "--revision") == "531df318dbe2877b24881f6e15024c7f945e7048"
    assert plan.image.engine_version == "0.16.0"
    assert plan_for("glm47", "seed-pinned").plan.image.engine_version == "0.15.1"


# seed 002 settings table
GLM52_ROWS = [
    ("--tensor-parallel-size", "4"),
    ("--decode-context-parallel-size", "4"),
    ("--max-model-len", "250000"),
    ("--max-num-seqs", "2"),
    ("--kv-cache-dtype", "fp8"),
    ("--quantization", "modelopt_fp4"),
    ("--attention-backend", "B12X_MLA_SPARSE"),
    ("--moe-backend", "b12x"),
    ("--tool-call-parser", "glm47"),
    ("--reasoning-parser", "glm45"),
]


@pytest.mark.parametrize(("flag", "value"), GLM52_ROWS)
def test_glm52_seed_row(flag: str, value: str) -> None:
    # Seed 002's validated config is the seed variant since the default moved to DCP 1.
    assert flag_value(argv_of("glm52", "seed"), flag) == value


def test_glm52_mtp_three_tokens() -> None:
    spec = json_flag(argv_of("glm52"), "--speculative-config")
    assert spec["method"] == "mtp"
    assert spec["num_speculative_tokens"] == 3


def test_glm52_nccl_p2p_disabled() -> None:
    assert render_env(plan_for("glm52").plan)["NCCL_P2P_DISABLE"] == "1"


def test_glm52_image_pinned_as_seed_names_it() -> None:
    image = plan_for("glm52").plan.image
    assert image.name == "voipmonitor/vllm"
    assert image.tag.startswith("black-benediction-")
    assert image.tag != "latest"


@pytest.mark.parametrize(
    ("variant", "dcp", "max_len", "decode", "concurrency"),
    [
        ("dcp4", "4", "250000", 60, 2.84),
        ("dcp2", "2", "250000", 49, 1.42),
        ("dcp1", "1", "131072", 81, 1.36),
    ],
)
def test_glm52_dcp_table_row(
    variant: str, dcp: str, max_len: str, decode: float, concurrency: float
) -> None:
    checked = plan_for("glm52", variant)
    argv = argv_of("glm52", variant)
    assert flag_value(argv, "--decode-context-parallel-size") == dcp
    assert flag_value(argv, "--max-model-len") == max_len
    baseline = checked.plan.baseline
    assert baseline is not None
    assert baseline.decode_tps == decode
    assert baseline.concurrency == concurrency


def test_glm52_thinking_off_variant_omits_reasoning_parser() -> None:
    argv = argv_of("glm52", "no-think")
    assert "--reasoning-parser" not in argv
    assert flag_value(argv, "--tool-call-parser") == "glm47"
    assert plan_for("glm52", "no-think").plan.thinking is False
    assert plan_for("glm52").plan.thinking is True


DSV4_ROWS = [
    ("--tensor-parallel-size", "2"),
    ("--kv-cache-dtype", "fp8"),
    ("--tokenizer-mode", "deepseek_v4"),
    ("--tool-call-parser", "deepseek_v4"),
    ("--reasoning-parser", "deepseek_v4"),
    ("--enable-auto-tool-choice", ""),
    ("--block-size", "256"),
    ("--trust-remote-code", ""),
]


@pytest.mark.parametrize(("flag", "value"), DSV4_ROWS)
def test_dsv4_seed_row(flag: str, value: str) -> None:
    assert flag_value(argv_of("dsv4"), flag) == value


def test_dsv4_mtp_two_and_pinned_branch() -> None:
    assert json_flag(argv_of("dsv4"), "--speculative-config")["num_speculative_tokens"] == 2
    image = plan_for("dsv4").plan.image
    assert image.engine_version == "sm120-pr-41834-stable-preview-20260626"
    assert image.engine_commit == "c766cbc6ff"


def test_dsv4_sm120_environment() -> None:
    env = render_env(plan_for("dsv4").plan)
    assert env["VLLM_TRITON_MLA_SPARSE_ALLOW_CUDAGRAPH"] == "1"


@pytest.mark.parametrize(("variant", "tp"), [("tp4", "4"), ("tp8", "8")])
def test_dsv4_tp_variants(variant: str, tp: str) -> None:
    checked = plan_for("dsv4", variant)
    assert flag_value(argv_of("dsv4", variant), "--tensor-parallel-size") == tp
    assert checked.plan.hardware.gpus == int(tp)


@pytest.mark.parametrize(
    ("variant", "repo", "quant"),
    [
        ("mxfp4", "deepseek-ai/DeepSeek-V4-Flash", "mxfp4"),
        ("fp8", "sgl-project/DeepSeek-V4-Flash-FP8", "fp8"),
        ("nvfp4", "nvidia/DeepSeek-V4-Flash-NVFP4", "nvfp4"),
    ],
)
def test_dsv4_checkpoint_variants(variant: str, repo: str, quant: str) -> None:
    plan = plan_for("dsv4", variant).plan
    assert plan.model.repo == repo
    assert plan.model.quantization == quant
    assert flag_value(argv_of("dsv4", variant), "--model") == repo


def test_dsv4_default_is_mxfp4_and_nvfp4_warns() -> None:
    assert plan_for("dsv4").plan.model.quantization == "mxfp4"
    statuses = {r.id: r.status for r in plan_for("dsv4", "nvfp4").results}
    assert statuses["F24"] == "warn"


def test_dsv4_flashinfer_decode_gate_variant() -> None:
    plan = plan_for("dsv4", "flashinfer-decode").plan
    assert plan.env_dict["VLLM_DEEPSEEK_V4_FLASHINFER_SM120_DECODE"] == "1"
    assert plan.image.build_args["FLASHINFER_VERSION"].startswith("0.6.13")


# seed 004 launch command
SGLANG_ROWS = [
    ("--tensor-parallel-size", "8"),
    ("--context-length", "393216"),
    ("--mem-fraction-static", "0.85"),
    ("--max-running-requests", "16"),
    ("--kv-cache-dtype", "fp8_e4m3"),
    ("--tool-call-parser", "deepseekv4"),
    ("--reasoning-parser", "deepseek-v4"),
    ("--attention-backend", "compressed"),
    ("--fp8-gemm-backend", "triton"),
    ("--moe-runner-backend", "triton"),
    ("--chunked-prefill-size", "8192"),
    ("--watchdog-timeout", "3600"),
    ("--page-size", "256"),
    ("--speculative-algorithm", "EAGLE"),
    ("--speculative-num-steps", "1"),
    ("--speculative-eagle-topk", "1"),
    ("--speculative-num-draft-tokens", "2"),
    ("--speculative-attention-mode", "decode"),
    ("--cuda-graph-max-bs", "32"),
    ("--trust-remote-code", ""),
]


@pytest.mark.parametrize(("flag", "value"), SGLANG_ROWS)
def test_dsv4_sglang_seed_row(flag: str, value: str) -> None:
    assert flag_value(argv_of("dsv4", "sglang"), flag) == value


def test_dsv4_sglang_is_sglang_with_the_patch_on_pythonpath() -> None:
    checked = plan_for("dsv4", "sglang")
    argv = argv_of("dsv4", "sglang")
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert flag_value(argv, "--model-path") == "sgl-project/DeepSeek-V4-Flash-FP8"
    assert "--block-size" not in argv  # the vLLM args were replaced, not merged
    assert checked.plan.env_dict["PYTHONPATH"] == "/dsv4"
    assert "VLLM_TRITON_MLA_SPARSE_ALLOW_CUDAGRAPH" not in checked.plan.env_dict


def test_tiny_renders_for_the_cpu_build(isolated_home: object) -> None:
    plan = plan_for("tiny").plan
    argv = argv_of("tiny")
    assert flag_value(argv, "--dtype") == "bfloat16"
    assert flag_value(argv, "--max-model-len") == "1024"
    assert plan.env_dict["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert plan.model_dir is not None and plan.model_dir.endswith("models/tiny")
    assert flag_value(argv, "--model") == plan.model_dir
