"""The derived index_topk_pattern (F09)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sm120.core.errors import PlanError
from sm120.plan.derive import derive_index_topk_pattern, hf_overrides_with_pattern
from tests.helpers import argv_of, json_flag, plan_for

# The 78-character pattern the seed's launcher hard-codes for GLM-5.2 (21 F, 57 S).
GLM52_PATTERN = "FFF" + "SSSF" * 18 + "SSS"
FULL_LAYERS = {0, 1, 2, *range(6, 78, 4)}


def glm52_config(**extra: object) -> dict[str, object]:
    types = ["full" if layer in FULL_LAYERS else "shared" for layer in range(78)]
    config: dict[str, object] = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "num_hidden_layers": 78,
        "index_topk": 2048,
        "indexer_types": types,
    }
    config.update(extra)
    return config


def test_glm52_pattern_from_indexer_types_is_exact() -> None:
    derived = derive_index_topk_pattern(glm52_config())
    assert derived.pattern == GLM52_PATTERN
    assert len(derived.pattern) == 78
    assert (derived.full_layers, derived.skip_layers) == (21, 57)
    assert derived.source == "indexer_types"


def test_frequency_rule_matches_vllm_arithmetic() -> None:
    config = glm52_config(index_topk_freq=4, index_skip_topk_offset=3)
    del config["indexer_types"]
    derived = derive_index_topk_pattern(config)
    assert derived.pattern == GLM52_PATTERN
    assert derived.source.startswith("index_topk_freq=4")


def test_frequency_rule_default_offset_two() -> None:
    derived = derive_index_topk_pattern({"num_hidden_layers": 10, "index_topk_freq": 4})
    # offset 2, freq 4 -> full at 0, 1, 5, 9 (vllm_facts.md §1.1)
    assert [i for i, c in enumerate(derived.pattern) if c == "F"] == [0, 1, 5, 9]


def test_a_different_indexer_types_gives_its_own_pattern() -> None:
    types = ["full", "shared", "full", "shared", "shared", "full"]
    derived = derive_index_topk_pattern({"num_hidden_layers": 6, "indexer_types": types})
    assert derived.pattern == "FSFSSF"
    assert derived.skip_layers == 3


def test_indexer_types_win_over_frequency() -> None:
    config = {
        "num_hidden_layers": 3,
        "indexer_types": ["full", "full", "shared"],
        "index_topk_freq": 1,
    }
    assert derive_index_topk_pattern(config).pattern == "FFS"


def test_length_mismatch_is_rejected() -> None:
    with pytest.raises(PlanError, match="has 3 layers but num_hidden_layers is 4"):
        derive_index_topk_pattern(
            {"num_hidden_layers": 4, "indexer_types": ["full", "shared", "full"]}
        )


def test_unknown_indexer_type_is_rejected() -> None:
    with pytest.raises(PlanError, match=r"indexer_types\[1\] is 'sparse'"):
        derive_index_topk_pattern({"num_hidden_layers": 2, "indexer_types": ["full", "sparse"]})


def test_config_without_indexer_fields_is_rejected() -> None:
    with pytest.raises(PlanError, match="neither indexer_types nor index_topk_freq"):
        derive_index_topk_pattern({"num_hidden_layers": 2})


def test_overrides_keep_existing_keys() -> None:
    derived = derive_index_topk_pattern({"num_hidden_layers": 2, "indexer_types": ["full"] * 2})
    merged = hf_overrides_with_pattern({"rope_scaling": None}, derived)
    assert merged == {"rope_scaling": None, "use_index_cache": True, "index_topk_pattern": "FF"}


def test_plan_with_model_dir_passes_the_pattern(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(glm52_config()))
    checked = plan_for("glm52", model_dir=str(tmp_path))
    overrides = json_flag(argv_of("glm52", model_dir=str(tmp_path)), "--hf-overrides")
    assert overrides == {"use_index_cache": True, "index_topk_pattern": GLM52_PATTERN}
    info = checked.plan.derived["index_topk_pattern"]
    assert info["skip_layers"] == 57
    assert checked.plan.provenance["args.hf-overrides"] == "derived"
    assert not checked.plan.pending


def test_plan_without_config_says_what_it_will_derive(tmp_path: Path) -> None:
    checked = plan_for("glm52", model_dir=str(tmp_path))
    assert checked.plan.derived == {}
    assert "config.json" in checked.plan.pending[0]
    assert str(tmp_path) in checked.plan.pending[0]


def test_pattern_given_on_the_command_line_wins(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(glm52_config()))
    given = 'hf-overrides={"index_topk_pattern": "' + "F" * 78 + '"}'
    checked = plan_for("glm52", model_dir=str(tmp_path), sets=(given,))
    assert checked.plan.derived["index_topk_pattern"]["source"] == "command line"
    assert (
        json_flag(argv_of("glm52", model_dir=str(tmp_path), sets=(given,)), "--hf-overrides")[
            "index_topk_pattern"
        ]
        == "F" * 78
    )
