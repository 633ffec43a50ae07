"""The decode roofline against hand computations, one per recipe configuration.

tok/s = bandwidth per GPU / (weight bytes a rank reads per token + KV bytes a rank reads).
Weight bytes are counted from the config where the recipe's dims give the attention and MLP
shape (glm52), else they are the resident weights less the unpicked routed experts, the MTP
layer's experts and all embedding rows but one (sm120/plan/fit/roofline.py explains each
term). A second hand computation from each checkpoint's config checks the resident way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.core.errors import PlanError
from sm120.plan.fit.roofline import decode_roofline, gpu_bandwidth
from sm120.plan.resolve import PlanRequest, resolve
from tests.helpers import REPO, invoke, one_line_error

RECIPES = REPO / "recipes"

GIB = 2**30
RTX_PRO_6000 = 1792e9  # bytes/s per GPU (512-bit GDDR7 at 28 Gbps)
GB10 = 273e9
NVFP4 = 0.5 + 1 / 16  # 4-bit values + one FP8 scale per 16
MXFP4 = 0.5 + 1 / 32  # 4-bit values + one E8M0 scale per 32

# DeepSeek-V4-Flash, MXFP4 experts, 148 GiB resident:
#   unpicked experts: 43 MoE layers x (256 - 6) experts x 3 x 4096 x 2048 params x MXFP4
#   the MTP layer's experts (only draft steps run them): 1 x 256 x 3 x 4096 x 2048 x MXFP4
#   embedding rows a token skips: 129,280 x 4096 x 2 bytes (bf16)
#   = 158,913,789,952 - 143,720,448,000 - 3,422,552,064 - 1,059,061,760
#   = 10,711,728,128 B a token
DSV4_WEIGHTS = (
    148 * GIB
    - 43 * 250 * 3 * 4096 * 2048 * MXFP4
    - 1 * 256 * 3 * 4096 * 2048 * MXFP4
    - 129280 * 4096 * 2
)
# KV at 2,048 tokens: 8 of the planner's 256-token DeepSeek-V4 blocks of 1,051,776 B per rank
DSV4_KV = 2048 // 256 * 1_051_776
# GLM-5.2 REAP-469B from its config (GLM-5 config.json; experts-only NVFP4, the rest bf16):
#   MLA attention, per layer:
#     q_a 6144 x 2048 = 12,582,912          q_b 2048 x 64 x (192 + 64) = 33,554,432
#     kv_a 6144 x (512 + 64) = 3,538,944    kv_b 512 x 64 x (192 + 256) = 14,680,064
#     o 64 x 256 x 6144 = 100,663,296       = 165,019,648 params, x 78 layers x 2 B
#   indexer on the 21 layers that compute their own top-k (index_topk_freq 4, offset 3):
#     wq_b 2048 x 32 x 128 + wk 6144 x 128 + weights_proj 6144 x 32 = 9,371,648, x 21 x 2 B
#   dense MLP: 3 layers x 3 x 6144 x 12288 = 679,477,248 params x 2 B (bf16)
#   experts: 75 MoE layers x (8 picked + 1 shared) x 3 x 6144 x 2048 params x NVFP4
#   LM head: 154,880 x 6144 x 2 B (a token reads one embedding row: left out)
GLM52_ATTENTION = (
    78 * (6144 * 2048 + 2048 * 64 * 256 + 6144 * 576 + 512 * 64 * 448 + 64 * 256 * 6144) * 2
)
GLM52_INDEXER = 21 * (2048 * 32 * 128 + 6144 * 128 + 6144 * 32) * 2
GLM52_WEIGHTS = (
    GLM52_ATTENTION
    + GLM52_INDEXER
    + 3 * 3 * 6144 * 12288 * 2
    + 75 * 9 * 3 * 6144 * 2048 * NVFP4
    + 154880 * 6144 * 2
)  # = 43,732,131,328 B a token
# vLLM keeps q_a + kv_a (fused_qkv_a_proj) and the indexer whole on every rank
GLM52_REPLICATED = 78 * (6144 * 2048 + 6144 * 576) * 2 + GLM52_INDEXER
GLM52_PER_RANK = (GLM52_WEIGHTS - GLM52_REPLICATED) / 4 + GLM52_REPLICATED
# KV: (78 + 1 MTP) layers x (656 B fp8_ds_mla + 132 B indexer) = 62,252 B a token, every rank
GLM52_KV_PER_TOKEN = 79 * (656 + 132)
# GLM-4.7, NVFP4 experts, 188.44 GiB resident:
#   unpicked: (92 - 3) layers x (160 - 8) experts x 3 x 5120 x 1536 x NVFP4
#   the MTP layer's experts: 1 x 160 x 3 x 5120 x 1536 x NVFP4
#   embedding: 151,552 x 5120 x 2
GLM47_WEIGHTS = (
    188.44 * GIB
    - 89 * 152 * 3 * 5120 * 1536 * NVFP4
    - 1 * 160 * 3 * 5120 * 1536 * NVFP4
    - 151552 * 5120 * 2
)
# KV: 92 layers x (K, V) x 2 of 8 KV heads per rank (TP 4) x 128 x 1 B (checkpoint fp8)
GLM47_KV_PER_TOKEN = 92 * 2 * 2 * 128 * 1

CASES = [
    # (recipe, variants, hand tok/s, rounded)
    ("dsv4", (), RTX_PRO_6000 / (DSV4_WEIGHTS / 2 + DSV4_KV), 334.1),
    # the seed default reads the same weights and KV: another kernel, the same roofline
    ("dsv4", ("seed",), RTX_PRO_6000 / (DSV4_WEIGHTS / 2 + DSV4_KV), 334.1),
    ("dsv4", ("gb10x2",), GB10 / (DSV4_WEIGHTS / 2 + DSV4_KV), 50.9),
    ("dsv4", ("tp4",), RTX_PRO_6000 / (DSV4_WEIGHTS / 4 + DSV4_KV), 667.1),
    # DCP 1 (the default): every rank reads all 2,048 tokens of KV
    ("glm52", (), RTX_PRO_6000 / (GLM52_PER_RANK + GLM52_KV_PER_TOKEN * 2048), 135.3),
    ("glm52", ("dcp1",), RTX_PRO_6000 / (GLM52_PER_RANK + GLM52_KV_PER_TOKEN * 2048), 135.3),
    # DCP 4 (the seed): each rank keeps (and reads) a quarter of the 2,048 tokens
    ("glm52", ("seed",), RTX_PRO_6000 / (GLM52_PER_RANK + GLM52_KV_PER_TOKEN * 512), 136.3),
    ("glm47", (), RTX_PRO_6000 / (GLM47_WEIGHTS / 4 + GLM47_KV_PER_TOKEN * 2048), 367.3),
]


@pytest.mark.parametrize(
    ("recipe", "variants", "hand", "rounded"), CASES, ids=[f"{c[0]}{c[1]}" for c in CASES]
)
def test_roofline_matches_the_hand_computation(
    recipe: str, variants: tuple[str, ...], hand: float, rounded: float
) -> None:
    roofline = decode_roofline(resolve(PlanRequest(recipe=recipe, variants=variants)))
    assert roofline.tok_s == pytest.approx(hand, rel=1e-9)
    assert round(roofline.tok_s, 1) == rounded


def test_context_adds_its_kv_read() -> None:
    plan = resolve(PlanRequest(recipe="glm47"))
    at_128k = decode_roofline(plan, context=131072)
    assert at_128k.kv_bytes_per_rank == GLM47_KV_PER_TOKEN * 131072
    assert at_128k.tok_s == pytest.approx(
        RTX_PRO_6000 / (GLM47_WEIGHTS / 4 + GLM47_KV_PER_TOKEN * 131072), rel=1e-9
    )
    assert decode_roofline(plan, context=0).tok_s == pytest.approx(
        RTX_PRO_6000 / (GLM47_WEIGHTS / 4), rel=1e-9
    )


def test_bandwidth_comes_from_the_exact_card_only() -> None:
    assert gpu_bandwidth("NVIDIA RTX PRO 6000 Blac...").gbs == 1792  # type: ignore[union-attr]
    assert gpu_bandwidth("NVIDIA GeForce RTX 5090").gbs == 1792  # type: ignore[union-attr]
    assert gpu_bandwidth("NVIDIA GB10").gbs == 273  # type: ignore[union-attr]
    # an RTX PRO 5000 is the same family with a narrower bus: no figure rather than a wrong one
    assert gpu_bandwidth("NVIDIA RTX PRO 5000 Blackwell") is None


def test_no_gpu_model_no_roofline() -> None:
    with pytest.raises(PlanError) as caught:
        decode_roofline(resolve(PlanRequest(recipe="tiny")))
    assert caught.value.one_line() == (
        "the recipe names no hardware.gpu_model (hint: add it, e.g. RTX PRO 6000)"
    )


def test_resident_weights_smaller_than_the_experts_are_refused() -> None:
    # 43 x 256 experts x 3 x 4096 x 2048 at 1 byte is 277 GB; the FP8 variant's 255.2 GiB
    # (274 GB) cannot hold them and the 6 picked ones' worth of everything else.
    with pytest.raises(PlanError) as caught:
        decode_roofline(resolve(PlanRequest(recipe="dsv4", variants=("fp8",))))
    assert caught.value.one_line() == (
        "model.weights_gib (255.2 GiB) is smaller than the routed experts model.dims and "
        "quantization 'fp8' describe (hint: check weights_gib against the engine's "
        "'Model loading took' line)"
    )


def test_recipes_show_json_gives_published_and_roofline(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "recipes", "show", "dsv4", "--json")
    assert code == 0, err
    document = json.loads(out)
    published = document["published"]
    # the default is PR #41834's gated FlashInfer SM120 decode; its table gives no prefill
    assert published["decode_tok_s"] == 201.4
    assert published["source"] == "https://github.com/vllm-project/vllm/pull/41834"
    assert published["date"] == "2026-06"
    assert (published["prefill_tok_s"], published["throughput_tok_s"]) == (None, 2814.8)
    assert published["throughput_concurrency"] == 64
    hand = RTX_PRO_6000 / (DSV4_WEIGHTS / 2 + DSV4_KV)
    assert document["roofline_decode_tok_s"] == round(hand, 1)
    assert document["roofline"]["bandwidth_gbs_per_gpu"] == 1792


def test_recipes_show_json_without_figures(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "recipes", "show", "tiny", "--json")
    document = json.loads(out)
    assert (code, document["published"], document["roofline_decode_tok_s"]) == (0, None, None)
    assert document["roofline"] == {
        "unknown": "the recipe names no hardware.gpu_model (hint: add it, e.g. RTX PRO 6000)"
    }


def test_human_view_shows_published_roofline_and_ratio(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "recipes", "show", "glm52")
    assert code == 0
    flat = " ".join(out.split())
    assert "published 81 tok/s decode at 1 request (4x RTX PRO 6000 Blackwell" in flat
    assert "source: https://github.com/0xSero/glm-5.2-sm120" in flat
    assert "roofline 135.3 tok/s decode at 2,048 tokens (TP 4 x 1792 GB/s" in flat
    assert f"published / roofline = {81 / 135.3:.2f}" in flat


def test_a_variant_measured_elsewhere_drops_the_default_figures() -> None:
    # tp4 runs other hardware: the TP 2 figures do not describe it
    assert resolve(PlanRequest(recipe="dsv4", variants=("tp4",))).published is None
    dcp1 = resolve(PlanRequest(recipe="glm52", variants=("dcp1",))).published
    assert dcp1 is not None and dcp1.decode.tok_s == 81
    gb10 = resolve(PlanRequest(recipe="dsv4", variants=("gb10x2",))).published
    assert gb10 is not None and (gb10.decode.tok_s, gb10.decode.date) == (40.0, "2026-06-21")
    # any engine flag changed counts: no-think is not the configuration that was measured
    assert resolve(PlanRequest(recipe="glm52", variants=("no-think",))).published is None
    # the default spelled out carries the default's figures
    mxfp4 = resolve(PlanRequest(recipe="dsv4", variants=("mxfp4",))).published
    assert mxfp4 is not None and mxfp4.decode.tok_s == 201.4
    # the seed variant brings back the seed's own figures
    seed = resolve(PlanRequest(recipe="dsv4", variants=("seed",))).published
    assert seed is not None and (seed.decode.tok_s, seed.decode.date) == (180.94, "2026-06-12")


def test_a_published_source_must_be_a_link(cli: CliRunner, tmp_path: Path) -> None:
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        (RECIPES / "tiny.yaml").read_text()
        + "published:\n  decode: {tok_s: 10, source: seed 000, hardware: x, "
        'date: "2026-02-21", engine_ref: v0.15.1}\n'
    )
    code, _, err = invoke(cli, "validate", str(recipe))
    assert (code, one_line_error(err)) == (
        2,
        f"Error: {recipe}: published.decode.source: String should match pattern "
        "'^https?://\\S+$' (hint: fix the value in the recipe)",
    )


def test_the_recipe_list_carries_both_figures(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "recipes", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0
    assert (rows["dsv4"]["published_decode_tok_s"], rows["dsv4"]["roofline_decode_tok_s"]) == (
        201.4,
        round(RTX_PRO_6000 / (DSV4_WEIGHTS / 2 + DSV4_KV), 1),
    )
    assert rows["glm47"]["published_decode_tok_s"] == 54  # vLLM 0.16.0, AlexGS74 at 2a4692d
    assert rows["tiny"]["roofline_decode_tok_s"] is None
