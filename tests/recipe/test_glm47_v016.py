"""glm47's default stack, vLLM 0.16.0, checked against the real 0.16.0 source (its wheel).

What the recipe's header says about each seed 000 patch is proved here: 0001 (F04) and 0003
(F06) apply to 0.16.0 unchanged and are still needed there (the unpatched code still fails),
while 0002 (F05) is upstream: 0.16.0's own parser reads both tool-call forms. Every engine flag
and environment variable a glm47 plan renders is looked up in the source of the vLLM release
that plan's image carries, and each image's engine-commit pin in that release's _version.py.
The wheels are fetched once per machine (tests/recipe/vllm_source.py): `integration`.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sm120.plan.resolve import LaunchPlan, PlanRequest, resolve
from sm120.recipe.loader import load_recipe
from sm120.recipe.patches import read_series
from sm120.render.argv import render_argv
from tests.helpers import REPO
from tests.recipe.test_glm47_patches import (
    FINISH,
    GLM45_CALL,
    GLM45_PARSER,
    GLM47_CALL,
    GLM47_NO_ARGS,
    GLM47_PARSER,
    GLM47_TWO_CALLS,
    MODEL_PARAMS,
    NVFP4_WEIGHTS,
    ROLE,
    TOOL_CALL,
    USAGE,
    WEATHER_TOOLS,
    _chunk,
    _summary,
    full_response,
    load_weights,
    parser_regex,
    stream_events,
    tool_calls_checked_first,
)
from tests.recipe.vllm_source import class_method, compile_function, vllm_source

pytestmark = pytest.mark.integration

VERSION = "0.16.0"
CONTEXT = REPO / "images/glm47-v016"
OLD_CONTEXT = REPO / "images/glm47"
STACK = read_series(CONTEXT / "patches")


@pytest.fixture(autouse=True)
def _regex_is_re(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM imports the `regex` package; the patterns it uses mean the same in `re`.
    monkeypatch.setitem(sys.modules, "regex", re)


@pytest.fixture(scope="session")
def pristine() -> Path:
    return vllm_source(VERSION)


@pytest.fixture(scope="module")
def patched(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site016")
    shutil.copytree(pristine / "vllm", site / "vllm")
    result = subprocess.run(
        ["sh", str(CONTEXT / "apply-patches.sh"), str(CONTEXT / "patches"), str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr
    assert "2 patches applied" in result.stderr
    return site


def _diff_body(text: str) -> str:
    return text[text.index("--- a/") :]


# --- the series -----------------------------------------------------------------------------


def test_series_carries_f04_and_f06_and_drops_f05() -> None:
    assert [(p.name, p.failure_ids, p.engine_version) for p in STACK] == [
        ("0001-glm4-moe-skip-missing-kv-scales.patch", ("F04",), "0.16.0"),
        ("0003-anthropic-serving-fixes.patch", ("F06",), "0.16.0"),
    ]
    # The hunks are the 0.15.1 image's, unchanged: only the header says another release.
    for info in STACK:
        ours = (CONTEXT / "patches" / info.name).read_text()
        theirs = (OLD_CONTEXT / "patches" / info.name).read_text()
        assert _diff_body(ours) == _diff_body(theirs)


def test_the_context_uses_the_same_patch_script() -> None:
    assert (CONTEXT / "apply-patches.sh").read_bytes() == (
        OLD_CONTEXT / "apply-patches.sh"
    ).read_bytes()


@pytest.mark.parametrize("info", STACK, ids=lambda info: info.name)
def test_each_patch_applies_to_016_with_no_offset_or_fuzz(info: Any, pristine: Path) -> None:
    text = (CONTEXT / "patches" / info.name).read_text()
    dry = subprocess.run(
        ["patch", "-d", str(pristine), "-p1", "--forward", "--batch", "--fuzz=0", "--dry-run"],
        input=text,
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "offset" not in dry.stdout and "fuzz" not in dry.stdout, dry.stdout


def test_the_dropped_patch_still_applies_but_016_needs_it_not(pristine: Path) -> None:
    # 0002 is dropped because 0.16.0 does its work, not because it stopped applying.
    text = (OLD_CONTEXT / "patches/0002-glm47-tool-parser.patch").read_text()
    dry = subprocess.run(
        ["patch", "-d", str(pristine), "-p1", "--forward", "--batch", "--fuzz=0", "--dry-run"],
        input=text,
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr


# --- F04 and F06 are still needed on 0.16.0 ---------------------------------------------------


def test_016_unpatched_loader_still_raises_the_seed_keyerror(pristine: Path) -> None:
    with pytest.raises(KeyError, match=r"layers\.41\.self_attn\.qkv_proj\.k_scale"):
        load_weights(pristine, MODEL_PARAMS, NVFP4_WEIGHTS)


def test_016_patched_loader_skips_the_missing_scales(patched: Path) -> None:
    loaded, loads = load_weights(patched, MODEL_PARAMS, NVFP4_WEIGHTS)
    assert loaded == set(MODEL_PARAMS)
    assert [name for name, _ in loads] == [
        "layers.41.self_attn.qkv_proj.weight",
        "layers.41.self_attn.qkv_proj.weight",
        "layers.41.self_attn.o_proj.weight",
    ]


def test_016_unpatched_stream_drops_the_tool_call(pristine: Path) -> None:
    summary = _summary(
        stream_events(
            pristine, [ROLE, _chunk({"content": "Let me check."}), TOOL_CALL, FINISH, USAGE]
        )
    )
    assert not any(row[0] == "content_block_start" and row[2] == "tool_use" for row in summary)
    assert not tool_calls_checked_first(pristine)
    with pytest.raises(TypeError, match="NoneType"):
        full_response(pristine, None)


def test_016_patched_stream_returns_the_tool_call(patched: Path) -> None:
    summary = _summary(
        stream_events(
            patched, [ROLE, _chunk({"content": "Let me check."}), TOOL_CALL, FINISH, USAGE]
        )
    )
    assert ("content_block_start", 1, "tool_use", "get_weather") in summary
    assert ("content_block_delta", 1, '{"city": "Paris", "days": 3}') in summary
    assert tool_calls_checked_first(patched)


# --- F05 is upstream in 0.16.0 ----------------------------------------------------------------


def extract_016(tree: Path, text: str) -> list[tuple[str, dict[str, Any]]]:
    """0.16.0's own Glm4MoeModelToolParser.extract_tool_calls with the regexes its unpatched
    Glm47MoeModelToolParser sets up (its helpers compiled from the same class)."""
    namespace: dict[str, Any] = {
        "json": json,
        "ast": ast,
        "Any": Any,
        "logger": logging.getLogger("vllm-under-test"),
        "ToolCall": SimpleNamespace,
        "FunctionCall": SimpleNamespace,
        "ExtractedToolCallInformation": SimpleNamespace,
    }
    source = tree / GLM45_PARSER

    def method(name: str) -> Any:
        return compile_function(class_method(source, "Glm4MoeModelToolParser", name), namespace)

    extract = method("extract_tool_calls")
    parser = SimpleNamespace(
        tool_calls_start_token="<tool_call>",
        func_call_regex=parser_regex(
            tree, GLM45_PARSER, "Glm4MoeModelToolParser", "func_call_regex"
        ),
        func_detail_regex=parser_regex(
            tree, GLM47_PARSER, "Glm47MoeModelToolParser", "func_detail_regex"
        ),
        func_arg_regex=parser_regex(
            tree, GLM47_PARSER, "Glm47MoeModelToolParser", "func_arg_regex"
        ),
        _is_string_type=method("_is_string_type"),
        _deserialize=method("_deserialize"),
    )
    info = extract(parser, text, SimpleNamespace(tools=WEATHER_TOOLS))
    return [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]


@pytest.mark.parametrize("text", [GLM45_CALL, GLM47_CALL], ids=["glm45-newline", "glm47-inline"])
def test_016_unpatched_parser_reads_both_forms(pristine: Path, text: str) -> None:
    assert extract_016(pristine, text) == [("get_weather", {"city": "Paris", "days": 3})]


def test_016_unpatched_parser_reads_several_calls_and_calls_without_arguments(
    pristine: Path,
) -> None:
    assert extract_016(pristine, GLM47_TWO_CALLS) == [
        ("read_file", {"path": "/etc/hosts"}),
        ("list_dir", {"path": "/tmp"}),
    ]
    assert extract_016(pristine, GLM47_NO_ARGS) == [("get_time", {})]


def test_016_streaming_cuts_the_name_at_a_newline_or_an_argument_tag(pristine: Path) -> None:
    # The streamed name ends at the first newline, <arg_key> or </tool_call> (PR #33218), so
    # GLM-4.7's inline form streams the bare name too.
    method = class_method(
        pristine / GLM45_PARSER, "Glm4MoeModelToolParser", "extract_tool_calls_streaming"
    )
    cut = next(
        node
        for node in ast.walk(method)
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "candidates"
    )
    assert ast.unparse(cut.value) == "[i for i in [nl, ak, end] if i != -1]"


# --- the recipe's plans against the release their image carries -----------------------------


def _glm47_plans() -> list[tuple[str, LaunchPlan]]:
    recipe = load_recipe("glm47")
    plans = [("default", resolve(PlanRequest(recipe="glm47")))]
    plans += [(v, resolve(PlanRequest(recipe="glm47", variants=(v,)))) for v in recipe.variants]
    return plans


PLANS = _glm47_plans()


def _cli_flags(tree: Path) -> set[str]:
    """Every --flag vLLM's `serve` parser in `tree` takes: the literals of the engine's
    arguments plus the frontend's, which argparse builds from FrontendArgs' fields."""
    flags: set[str] = set()
    for relative in ("vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py"):
        module = ast.parse((tree / relative).read_text())
        for node in ast.walk(module):
            literal = node.value if isinstance(node, ast.Constant) else None
            if isinstance(literal, str) and re.fullmatch(r"--[a-z0-9][a-z0-9-]*", literal):
                flags.add(literal)
            if isinstance(node, ast.ClassDef) and node.name.endswith("FrontendArgs"):
                flags |= {
                    "--" + item.target.id.replace("_", "-")
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                }
    return flags


def _env_names(tree: Path) -> set[str]:
    text = (tree / "vllm/envs.py").read_text()
    return set(re.findall(r'^    "([A-Z][A-Z0-9_]+)": ', text, re.M))


@pytest.mark.parametrize(("variant", "plan"), PLANS, ids=[name for name, _ in PLANS])
def test_every_flag_and_variable_is_real_in_the_plans_vllm(variant: str, plan: LaunchPlan) -> None:
    tree = vllm_source(plan.image.engine_version)
    flags = {arg for arg in render_argv(plan) if arg.startswith("--")}
    assert flags - _cli_flags(tree) == set(), (
        f"{variant}: flags vLLM {plan.image.engine_version} lacks"
    )
    engine_vars = {name for name in plan.env_dict if name.startswith("VLLM_")}
    assert engine_vars - _env_names(tree) == set(), variant


@pytest.mark.parametrize(("variant", "plan"), PLANS, ids=[name for name, _ in PLANS])
def test_each_pinned_engine_commit_is_the_one_its_wheel_states(
    variant: str, plan: LaunchPlan
) -> None:
    if plan.image.engine_commit is None:
        assert variant == "seed"  # the seed's image spec as written carries no pin
        return
    version_file = (vllm_source(plan.image.engine_version) / "vllm/_version.py").read_text()
    match = re.search(r"^__commit_id__ = commit_id = '(g[0-9a-f]+)'$", version_file, re.M)
    assert match is not None
    assert plan.image.engine_commit == match.group(1).removeprefix("g")


def test_the_default_builds_the_016_context_and_the_variants_the_015_one() -> None:
    contexts = {name: (plan.image.context, plan.image.engine_version) for name, plan in PLANS}
    assert contexts == {
        "default": ("glm47-v016", "0.16.0"),
        "vllm-0.15.1": ("glm47", "0.15.1"),
        "seed-pinned": ("glm47", "0.15.1"),
        "seed": ("glm47", "0.15.1"),
    }


def test_the_compilation_config_keys_and_mode_are_016s(pristine: Path) -> None:
    # {"level": 3, "cudagraph_mode": "full"} as the source passes it: 0.16.0 still has the
    # deprecated `level` field (read as `mode`) and parses the graph mode case-insensitively.
    config = load_recipe("glm47").args["compilation-config"]
    assert config == {"level": 3, "cudagraph_mode": "full"}
    module = ast.parse((pristine / "vllm/config/compilation.py").read_text())
    classes = {node.name: node for node in module.body if isinstance(node, ast.ClassDef)}
    fields = {
        item.target.id
        for item in classes["CompilationConfig"].body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }
    assert set(config) <= fields
    modes = {
        target.id
        for item in classes["CUDAGraphMode"].body
        if isinstance(item, ast.Assign)
        for target in item.targets
        if isinstance(target, ast.Name)
    }
    assert str(config["cudagraph_mode"]).upper() in modes
    assert "CUDAGraphMode[value.upper()]" in (pristine / "vllm/config/compilation.py").read_text()
