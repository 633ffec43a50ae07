"""kimik3: the image launcher's expansion for the page's knobs, rendered flag for flag; the
figures, sources and pins the page gives; the refusals that remain on nine GPUs."""

from __future__ import annotations

import json
import shlex

from typer.testing import CliRunner

from sm120.plan.hardware import Hardware
from sm120.recipe.loader import load_recipe
from tests.helpers import DATA_DIR, argv_of, invoke, one_line_error, plan_for

NINE_SM120 = Hardware(gpus=9, arch="sm_120", source="declared")

LAUNCHER = (DATA_DIR / "kimi-k3" / "serve-kimi-k3-tp9-dspark.cmd").read_text()


def _groups(tokens: list[str]) -> list[tuple[str, str]]:
    """(flag, value) pairs, JSON values compared as data; the kv tier renders after the flags,
    the launcher has it in the middle, so the order is not compared, only the pairs."""
    pairs: list[tuple[str, str]] = []
    for token in tokens:
        if token.startswith("--"):
            pairs.append((token, ""))
            continue
        try:
            value = json.dumps(json.loads(token), sort_keys=True)
        except json.JSONDecodeError:
            value = token
        pairs[-1] = (pairs[-1][0], value)
    return sorted(pairs)


def test_the_default_renders_the_launchers_command_flag_for_flag() -> None:
    argv = argv_of("kimik3")
    assert _groups(argv[argv.index("--port") + 2 :]) == _groups(shlex.split(LAUNCHER))
    assert argv_of("kimik3") == argv_of("kimik3", "seed")


def test_the_checkpoint_and_the_drafter_are_pinned_at_the_pages_revisions() -> None:
    argv = argv_of("kimik3")
    assert argv[argv.index("--model") + 1] == "lukealonso/Kimi-K3-QSRT-K2"
    assert argv[argv.index("--revision") + 1] == "3b98114115f1d41ce7963ba346c3fca19918b0bd"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert (spec["model"], spec["revision"], spec["num_speculative_tokens"]) == (
        "RedHatAI/Kimi-K3-speculator.dspark",
        "38a88101e0d46bb22134b9da340f381b954d40d4",
        5,
    )


def test_published_figures_and_pins() -> None:
    recipe = load_recipe("kimik3")
    assert recipe.published is not None
    assert recipe.published.decode.tok_s == 109.72
    assert recipe.published.decode.source.endswith("models/kimi-k3/qsrt-tp9-dspark.md")
    assert "3abbbff" in recipe.published.decode.source
    assert recipe.baseline is not None
    assert (recipe.baseline.kv_pool_tokens, recipe.baseline.max_context) == (3262264, 950000)
    assert recipe.image.pin == "commit 9367f3712c2290cc9c6df1b12f4c5a5b7bc082e0"
    assert recipe.hardware.gpus == 9


def test_the_config_copy_is_kimi_k3s_shape() -> None:
    config = json.loads((DATA_DIR / "model_configs" / "kimi-k3.json").read_text())
    text = config["text_config"]
    assert config["architectures"] == [load_recipe("kimik3").model.architecture]
    layers = text["linear_attn_config"]
    assert len(layers["kda_layers"]) + len(layers["full_attn_layers"]) == 93
    assert (text["num_attention_heads"], text["kv_lora_rank"], text["num_experts"]) == (
        96,
        512,
        896,
    )
    # 96 heads do not split over 9 ranks: the fork's uneven shards are what make TP 9 work
    assert text["num_attention_heads"] % 9 == 6


def test_every_error_rule_passes_on_nine_sm120_gpus() -> None:
    checked = plan_for("kimik3", hardware=NINE_SM120)
    assert [r.id for r in checked.results if r.status == "fail"] == []
    warned = {r.id for r in checked.results if r.status == "warn"}
    # P2P on, as the source runs it (F10); the coding-agent rules on a fork whose release order
    # is unknown (F40, F41)
    assert warned == {"F10", "F40", "F41"}


def test_plan_on_nine_gpus_tries_the_dcps_that_divide_tp_9(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "plan", "kimik3", "--gpus", "9", "--kv-memory-gib", "20", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert (plan["tp"], plan["dcp"], plan["gpus"]) == (9, 9, 9)
    assert [(o["tp"], o["dcp"]) for o in plan["alternatives"]] == [(9, 1), (9, 3), (9, 9)]
    assert (plan["recommendation"]["tp"], plan["recommendation"]["dcp"]) == (9, 9)


def test_plan_without_a_kv_budget_says_what_it_lacks(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "plan", "kimik3", "--gpus", "9")
    assert code == 2
    assert one_line_error(err) == (
        "Error: the resident weight size is unknown: the recipe has no model.weights_gib and "
        "quantization 'qsrt_k2' has no bytes-per-parameter figure to estimate it "
        "(hint: pass --model-dir with the weights, or --kv-memory-gib)"
    )
