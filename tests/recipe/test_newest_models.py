"""The newest-model recipes (dsv41, glm53flash, qwen38flash) and dsv4's dspark variant: each
renders its source's resolved vLLM command flag for flag, the defaults differ from it only where
the measurement did, and the planner says plainly that it cannot size these models."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from sm120.core.errors import PlanError
from sm120.recipe.catalogue import coerce_flag_value, engine_flags
from sm120.recipe.loader import load_recipe
from tests.helpers import DATA_DIR, argv_of, invoke, plan_for

# The resolved vLLM commands the sources print (tests/data/karmic-kraken/SOURCES.md says
# where), without the interpreter, the model, --host, --port and --served-model-name, which
# sm120 renders itself.
DSV41_SOURCE = (DATA_DIR / "karmic-kraken" / "dsv41-resolved.cmd").read_text()

DSV4_DSPARK_SOURCE = (DATA_DIR / "karmic-kraken" / "dsv4-dspark-resolved.cmd").read_text()
QWEN38_SOURCE = (DATA_DIR / "karmic-kraken" / "qwen38flash-resolved.cmd").read_text()
GLM53_SOURCE = (DATA_DIR / "karmic-kraken" / "glm53flash-resolved.cmd").read_text()


def _flags(argv: list[str]) -> list[str]:
    """The recipe's own flags: what follows --port and its value."""
    return argv[argv.index("--port") + 2 :]


def _canonical(tokens: list[str]) -> list[str]:
    """JSON values compared as data (key order and spacing are the writer's)."""
    out = []
    for token in tokens:
        try:
            value = json.loads(token)
        except json.JSONDecodeError:
            out.append(token)
            continue
        out.append(json.dumps(value, sort_keys=True) if isinstance(value, dict) else token)
    return out


@pytest.mark.parametrize(
    ("recipe", "variant", "source"),
    [
        ("dsv41", "seed", DSV41_SOURCE),
        ("glm53flash", "seed", GLM53_SOURCE),
        ("qwen38flash", "seed", QWEN38_SOURCE),
        ("dsv4", "dspark", DSV4_DSPARK_SOURCE),
    ],
)
def test_variant_renders_the_sources_command_flag_for_flag(
    recipe: str, variant: str, source: str
) -> None:
    rendered = _flags(argv_of(recipe, variant))
    assert _canonical(rendered) == _canonical(shlex.split(source))


def test_dsv4_dspark_pins_the_checkpoint_revision_the_source_serves() -> None:
    argv = argv_of("dsv4", "dspark")
    assert argv[argv.index("--model") + 1] == "deepseek-ai/DeepSeek-V4-Flash-0731"
    assert argv[argv.index("--revision") + 1] == "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"


def test_dsv4_default_is_still_the_pr41834_stack() -> None:
    # the dspark variant is another checkpoint and image; the default did not move with it
    loaded = load_recipe("dsv4")
    assert loaded.model.repo == "deepseek-ai/DeepSeek-V4-Flash"
    assert loaded.published is not None and loaded.published.decode.tok_s == 201.4


def test_glm53_default_is_the_sources_command() -> None:
    assert argv_of("glm53flash") == argv_of("glm53flash", "seed")


def test_dsv41_default_differs_from_the_source_only_where_the_measurement_did() -> None:
    seed, default = _flags(argv_of("dsv41", "seed")), _flags(argv_of("dsv41"))
    changed = {
        seed[i - 1]: (seed[i], default[i]) for i in range(1, len(seed)) if seed[i] != default[i]
    }
    assert set(changed) == {"--engram-config", "--max-model-len"}
    assert json.loads(changed["--engram-config"][1])["table_memory"] == "ram"
    assert changed["--max-model-len"] == ("-1", "131072")


def test_qwen38_default_adds_only_the_measured_8_gib_kv_cache() -> None:
    seed, default = _flags(argv_of("qwen38flash", "seed")), _flags(argv_of("qwen38flash"))
    index = default.index("--kv-cache-memory-bytes")
    assert default[index + 1] == str(8 * 1024**3)
    assert default[:index] + default[index + 2 :] == seed


def test_int_list_flag_renders_one_argument_per_size() -> None:
    argv = argv_of("glm53flash")
    start = argv.index("--cudagraph-capture-sizes") + 1
    assert argv[start : start + 3] == ["1", "2", "4"]
    assert argv[start + 12] == "256"
    assert argv[start + 13].startswith("--")


@pytest.mark.parametrize(
    ("recipe", "variant", "decode", "gpus"),
    [
        ("dsv41", None, 273.96, 4),
        ("glm53flash", None, 255.71, 4),
        ("qwen38flash", None, 178.52, 1),
        ("dsv4", "dspark", 205.54, 2),
    ],
)
def test_published_decode_is_the_karmic_kraken_c1_figure(
    recipe: str, variant: str | None, decode: float, gpus: int
) -> None:
    plan = plan_for(recipe, *([variant] if variant else [])).plan
    assert plan.published is not None
    assert plan.published.decode.tok_s == decode
    assert plan.published.decode.source.endswith("benchmarks/karmic-kraken-serving.md")
    assert plan.hardware.gpus == gpus


@pytest.mark.parametrize(
    ("recipe", "layout"),
    [
        ("dsv41", "4 KV source layers x 584 B per stored token"),
        ("glm53flash", "34 recurrent layers"),
        ("qwen38flash", "36 recurrent layers"),
    ],
)
def test_these_models_have_a_kv_layout_but_no_published_weight_size(
    recipe: str, layout: str, cli: CliRunner
) -> None:
    # no stated size: the plan estimates the weights from model.dims and says so
    code, out, err = invoke(
        cli, "plan", recipe, "--gpus", "4", "--set", "kv-cache-memory-bytes=null", "--json"
    )
    assert code in (0, 1), err
    assert json.loads(out)["weights_source"].startswith("estimated from config dims")
    code, out, err = invoke(cli, "plan", recipe, "--gpus", "4", "--kv-memory-gib", "20", "--json")
    assert code == 0, err
    assert layout in json.loads(out)["kv_layout"]


@pytest.mark.parametrize(("value", "passes"), [(-1, True), (0, False), (-2, False)])
def test_max_model_len_takes_minus_one_but_nothing_else_below_one(value: int, passes: bool) -> None:
    checked = plan_for("dsv41", sets=(f"max-model-len={value}",))
    s04 = next(r for r in checked.results if r.id == "S04")
    assert (s04.status == "pass") is passes
    if not passes:
        assert f"max-model-len must be at least 1, got {value}" in s04.messages


@pytest.mark.parametrize("value", [[], ["1", "2"], [1, True], 8, "1 2 4"])
def test_int_list_flag_refuses_anything_but_a_list_of_ints(value: object) -> None:
    spec = engine_flags("vllm").spec("cudagraph-capture-sizes")
    with pytest.raises(PlanError, match="cudagraph-capture-sizes expects a list of integers"):
        coerce_flag_value(spec, value)


def test_int_list_flag_takes_a_list_of_ints() -> None:
    spec = engine_flags("vllm").spec("cudagraph-capture-sizes")
    assert coerce_flag_value(spec, [1, 2, 4]) == [1, 2, 4]


@pytest.mark.parametrize(("variants", "said"), [(("-V", "dspark"), True), ((), False)])
def test_recipes_show_says_plainly_when_a_variant_serves_another_checkpoint(
    variants: tuple[str, ...], said: bool, cli: CliRunner
) -> None:
    code, out, err = invoke(cli, "recipes", "show", "dsv4", *variants)
    assert code == 0, err
    assert ("another checkpoint than the default's (deepseek-ai/DeepSeek-V4-Flash)" in out) is said
