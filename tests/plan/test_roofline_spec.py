"""The roofline at the plan's speculative depth, and the resident-size way of counting a
token's weight bytes checked against each checkpoint's config, by hand.

A verify pass reads the weights once and yields 1 + accepted draft tokens; before it, K MTP
draft steps each read one decoder layer and the LM head (sm120/plan/fit/roofline.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from sm120.cli.present import performance_lines
from sm120.deploy.checked import performance_document
from sm120.plan.fit.roofline import decode_roofline, speculative_roofline
from sm120.plan.resolve import LaunchPlan, PlanRequest, resolve
from sm120.recipe.schema import Acceptance
from tests.helpers import invoke
from tests.plan.test_roofline import (
    DSV4_KV,
    DSV4_WEIGHTS,
    GLM47_WEIGHTS,
    GLM52_KV_PER_TOKEN,
    GLM52_PER_RANK,
    MXFP4,
    NVFP4,
    RTX_PRO_6000,
)

GIB = 2**30
# One GLM-5.2 MTP step: the MTP layer's attention (165,019,648 params, bf16), its 8 picked +
# 1 shared experts (3 x 6144 x 2048 params each, NVFP4) and the LM head (154,880 x 6144, bf16)
GLM52_DRAFT_STEP = 165_019_648 * 2 + 9 * 3 * 6144 * 2048 * NVFP4 + 154880 * 6144 * 2
# DeepSeek-V4-Flash has no attention shape in its dims: one step is a layer's share of the
# token's bytes (less the LM head) plus the LM head (129,280 x 4096, bf16)
DSV4_LM_HEAD = 129280 * 4096 * 2
DSV4_DRAFT_STEP = (DSV4_WEIGHTS - DSV4_LM_HEAD) / 43 + DSV4_LM_HEAD


def _with_acceptance(plan: LaunchPlan, accepted: float, decode: float | None = None) -> LaunchPlan:
    published = plan.published
    assert published is not None
    figure = (
        published.decode
        if decode is None
        else published.decode.model_copy(update={"tok_s": decode})
    )
    acceptance = Acceptance(accepted_per_pass=accepted, source="seed 001: ~68% MTP acceptance")
    return dataclasses.replace(
        plan, published=published.model_copy(update={"decode": figure, "acceptance": acceptance})
    )


def test_glm52_at_mtp_3_with_every_draft_accepted() -> None:
    plan = resolve(PlanRequest(recipe="glm52"))
    spec = speculative_roofline(plan, decode_roofline(plan))
    assert spec is not None
    per_pass = GLM52_PER_RANK + 3 * GLM52_DRAFT_STEP / 4 + GLM52_KV_PER_TOKEN * 2048
    assert spec.tok_s == pytest.approx(4 * RTX_PRO_6000 / per_pass, rel=1e-9)
    assert round(spec.tok_s, 1) == 476.0
    assert spec.acceptance_from == "ceiling: every draft accepted (no published figure)"


def test_dsv4_at_mtp_2_with_the_published_acceptance() -> None:
    # seed 001: ~68% of MTP 2's drafts accepted = 1.36 a pass, so 2.36 tokens a pass
    plan = _with_acceptance(resolve(PlanRequest(recipe="dsv4", variants=("pr41834",))), 2 * 0.68)
    spec = speculative_roofline(plan, decode_roofline(plan))
    assert spec is not None
    per_pass = DSV4_WEIGHTS / 2 + 2 * DSV4_DRAFT_STEP / 2 + DSV4_KV
    assert spec.tok_s == pytest.approx(2.36 * RTX_PRO_6000 / per_pass, rel=1e-9)
    assert spec.as_dict()["tokens_per_pass"] == 2.36
    assert spec.acceptance_from == "seed 001: ~68% MTP acceptance"


def test_an_acceptance_above_the_draft_count_is_capped() -> None:
    plan = _with_acceptance(resolve(PlanRequest(recipe="dsv4", variants=("pr41834",))), 5.0)
    spec = speculative_roofline(plan, decode_roofline(plan))
    assert spec is not None and spec.accepted_per_pass == 2.0


def test_no_speculative_decoding_no_speculative_roofline() -> None:
    plan = resolve(PlanRequest(recipe="glm47"))
    assert speculative_roofline(plan, decode_roofline(plan)) is None
    assert performance_document(plan)["roofline_spec_decode_tok_s"] is None


def test_a_figure_above_the_speculative_roofline_is_suspect() -> None:
    plan = resolve(PlanRequest(recipe="dsv4", variants=("pr41834",)))
    honest = performance_document(_with_acceptance(plan, 1.36))
    assert honest["published_suspect"] is False
    bound = honest["roofline_spec_decode_tok_s"]
    too_fast = performance_document(_with_acceptance(plan, 1.36, decode=bound + 1))
    assert too_fast["published_suspect"] is True
    lines = performance_lines(_with_acceptance(plan, 1.36, decode=bound + 1))
    assert lines[-1] == (
        "suspect    the published figure is above the speculative roofline: check its "
        "source's conditions before taking it as a target"
    )


def test_without_speculation_the_plain_roofline_is_the_bound() -> None:
    plan = resolve(PlanRequest(recipe="glm47"))
    assert plan.published is not None
    fast = plan.published.model_copy(
        update={"decode": plan.published.decode.model_copy(update={"tok_s": 400.0})}
    )
    document = performance_document(dataclasses.replace(plan, published=fast))
    assert document["roofline_decode_tok_s"] == 367.3
    assert document["published_suspect"] is True


def test_recipes_show_json_adds_the_speculative_roofline(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "recipes", "show", "glm52", "--json")
    document = json.loads(out)
    assert code == 0
    assert document["roofline_spec_decode_tok_s"] == 476.0
    assert document["roofline_spec"]["tokens_per_pass"] == 4
    assert document["roofline_spec"]["method"] == "mtp"
    assert document["published_suspect"] is False
    code, out, _ = invoke(cli, "recipes", "show", "glm52")
    flat = " ".join(out.split())
    assert "spec 476 tok/s decode with mtp 3: 4 tokens a pass" in flat
    assert "acceptance: ceiling: every draft accepted (no published figure)" in flat


# --- the resident way against the config, by hand ---------------------------------------------


def test_glm47_resident_bytes_agree_with_its_config() -> None:
    # GLM-4.7 config.json: 92 layers (3 dense), 96 heads, 8 KV heads of 128, hidden 5120,
    # dense MLP 12288, 160 routed + 1 shared experts of 1536, top-8, vocab 151,552.
    attention = 5120 * 96 * 128 + 2 * 5120 * 8 * 128 + 96 * 128 * 5120  # 136,314,880 a layer
    dense = 3 * 3 * 5120 * 12288
    experts = 89 * (8 + 1) * 3 * 5120 * 1536
    lm_head = 151552 * 5120 * 2
    # every linear layer NVFP4 (attention too): 19,554,795,520 B a token
    by_config = (92 * attention + dense + experts) * NVFP4 + lm_head
    assert decode_roofline(resolve(PlanRequest(recipe="glm47"))).weight_bytes == pytest.approx(
        GLM47_WEIGHTS
    )
    assert GLM47_WEIGHTS / by_config == pytest.approx(0.978, abs=0.005)
    # why NVFP4 attention: at bf16 the resident weights could not fit in 188.44 GiB
    all_experts = (89 + 1) * 160 * 3 * 5120 * 1536 * NVFP4
    assert all_experts + 93 * attention * 2 + 2 * lm_head > 188.44 * GIB


def test_dsv4_resident_bytes_agree_with_its_published_active_size() -> None:
    # DeepSeek-V4-Flash: 13B of 284B parameters active a token (the model card); of those,
    # 6 routed experts x 43 layers x 3 x 4096 x 2048 are MXFP4, the rest FP8 (1 B): the
    # LM head's bf16 and the mHC streams account for the few percent left.
    routed = 43 * 6 * 3 * 4096 * 2048
    by_card = routed * MXFP4 + (13e9 - routed) * 1
    assert DSV4_WEIGHTS / by_card == pytest.approx(1.076, abs=0.005)


def test_glm52_resident_way_would_count_53_gb_a_token_never_reads() -> None:
    # 314.4 GiB resident, less the unpicked and MTP experts and the embedding, leaves
    # 96.7 GB "read" a token: 53 GB more than the config's 43.7 GB. The model's own
    # parameters at experts-only NVFP4 come to 285 GB, 53 GB under the resident 337.6 GB:
    # bytes the config does not explain (replicated copies, engine buffers, layers kept at
    # higher precision), which the resident way counted as read by every token.
    routed = (75 + 1) * 156 * 3 * 6144 * 2048  # 75 MoE layers + the MTP layer
    rest_bf16 = 79 * 165_019_648 + 21 * 9_371_648 + 3 * 3 * 6144 * 12288 + 2 * 154880 * 6144
    shared = 76 * 3 * 6144 * 2048
    by_config = (routed + shared) * NVFP4 + rest_bf16 * 2
    assert by_config / 1e9 == pytest.approx(285.0, abs=0.1)
    assert (314.4 * GIB - by_config) / 1e9 == pytest.approx(52.6, abs=0.1)


def test_the_dsv4_seed_uses_its_published_acceptance() -> None:
    # seed 001: MTP 2 with 68.36% of drafts accepted at C=1 -> 1.367 accepted, 2.367 a pass
    plan = resolve(PlanRequest(recipe="dsv4", variants=("seed",)))
    spec = speculative_roofline(plan, decode_roofline(plan))
    assert spec is not None
    per_pass = DSV4_WEIGHTS / 2 + 2 * DSV4_DRAFT_STEP / 2 + DSV4_KV
    assert spec.tok_s == pytest.approx(2.367 * RTX_PRO_6000 / per_pass, rel=1e-9)
    assert round(spec.tok_s, 1) == 638.1
    assert spec.acceptance_from.startswith("seed 001 (PR #41834 stable preview, 2026-06-12)")
    # 180.94 published sits well under it: not suspect
    assert performance_document(plan)["published_suspect"] is False


def test_the_recipe_list_carries_the_speculative_roofline(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "recipes", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0
    assert rows["glm52"]["roofline_spec_decode_tok_s"] == 476.0
    assert rows["glm47"]["roofline_spec_decode_tok_s"] is None  # no speculative decoding
