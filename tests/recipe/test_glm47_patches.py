"""The glm47 patch stack against the real vLLM 0.15.1 source (seed 000; F04, F05, F06).

The source comes from the released wheel, fetched once per machine (tests/recipe/vllm_source.py), so
these tests are `integration`: the first run needs the network. Each behaviour test runs the
same code from the pristine tree too and shows the bug is there without the patch.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import py_compile
import re
import shutil
import subprocess
import sys
import typing
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sm120.recipe.loader import load_recipe
from sm120.recipe.patches import PatchInfo, read_series
from tests.helpers import REPO
from tests.recipe.vllm_source import (
    class_method,
    compile_function,
    init_assignment,
    module_function,
    vllm_source,
)

pytestmark = pytest.mark.integration

CONTEXT = REPO / "images/glm47"
PATCH_DIR = CONTEXT / "patches"
SCRIPT = CONTEXT / "apply-patches.sh"
VERSION = "0.15.1"

GLM4_MOE = "vllm/model_executor/models/glm4_moe.py"
WEIGHT_UTILS = "vllm/model_executor/model_loader/weight_utils.py"
GLM45_PARSER = "vllm/tool_parsers/glm4_moe_tool_parser.py"
GLM47_PARSER = "vllm/tool_parsers/glm47_moe_tool_parser.py"
PARSER_REGISTRY = "vllm/tool_parsers/__init__.py"
ANTHROPIC = "vllm/entrypoints/anthropic/serving.py"

STACK = read_series(PATCH_DIR)


@pytest.fixture(scope="session")
def pristine() -> Path:
    return vllm_source(VERSION)


@pytest.fixture(scope="module")
def patched(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A full copy of the 0.15.1 tree with the series applied by the image's own script."""
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(pristine / "vllm", site / "vllm")
    result = run_script(PATCH_DIR, site)
    assert result.returncode == 0, result.stderr
    return site


def run_script(patch_dir: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(SCRIPT), str(patch_dir), str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )


# --- applying -----------------------------------------------------------------------------


def test_series_is_the_three_seed_000_patches() -> None:
    assert [(p.name, p.failure_ids) for p in STACK] == [
        ("0001-glm4-moe-skip-missing-kv-scales.patch", ("F04",)),
        ("0002-glm47-tool-parser.patch", ("F05",)),
        ("0003-anthropic-serving-fixes.patch", ("F06",)),
    ]
    assert [p.files for p in STACK] == [(GLM4_MOE,), (GLM47_PARSER,), (ANTHROPIC,)]


@pytest.mark.parametrize("info", STACK, ids=lambda info: info.name)
def test_each_patch_applies_exactly_and_compiles(
    info: PatchInfo, pristine: Path, tmp_path: Path
) -> None:
    for relative in info.files:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pristine / relative, tmp_path / relative)
    patch = ["patch", "-d", str(tmp_path), "-p1", "--forward", "--batch", "--fuzz=0"]
    text = (PATCH_DIR / info.name).read_text()
    dry = subprocess.run([*patch, "--dry-run"], input=text, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    real = subprocess.run(patch, input=text, capture_output=True, text=True)
    assert real.returncode == 0, real.stdout + real.stderr
    # No offsets or fuzz: the hunks were made against exactly this release.
    assert "offset" not in real.stdout and "fuzz" not in real.stdout, real.stdout
    for relative in info.files:
        assert (tmp_path / relative).read_text() != (pristine / relative).read_text()
        py_compile.compile(str(tmp_path / relative), doraise=True)


def test_script_patches_the_tree_and_byte_compiles_it(patched: Path, pristine: Path) -> None:
    for relative in (GLM4_MOE, GLM47_PARSER, ANTHROPIC):
        assert (patched / relative).read_text() != (pristine / relative).read_text()
        cached = list((patched / relative).parent.glob(f"__pycache__/{Path(relative).stem}.*.pyc"))
        assert cached, f"{relative} was not byte-compiled"
    assert not list(patched.rglob("*.orig")) and not list(patched.rglob("*.rej"))


def test_script_refuses_a_tree_already_patched(patched: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(patched / "vllm", site / "vllm")
    result = run_script(PATCH_DIR, site)
    assert result.returncode != 0
    assert "0001-glm4-moe-skip-missing-kv-scales.patch does not apply" in result.stderr


def test_script_fails_on_a_corrupted_patch_and_leaves_its_file_alone(
    pristine: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "patches"
    shutil.copytree(PATCH_DIR, broken)
    target = broken / "0003-anthropic-serving-fixes.patch"
    text = target.read_text()
    context = "                        # content\n"
    assert f"-{context}" in text
    # A removed line that is not in the source: that hunk cannot apply.
    target.write_text(text.replace(f"-{context}", "-                        # contents\n", 1))
    site = tmp_path / "site"
    shutil.copytree(pristine / "vllm", site / "vllm")

    result = run_script(broken, site)

    assert result.returncode != 0
    assert "0003-anthropic-serving-fixes.patch does not apply" in result.stderr
    assert (site / ANTHROPIC).read_text() == (pristine / ANTHROPIC).read_text()


def test_script_fails_when_a_patched_module_does_not_compile(
    pristine: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "patches"
    shutil.copytree(PATCH_DIR, broken)
    target = broken / "0002-glm47-tool-parser.patch"
    text = target.read_text()
    added = '+            r"<tool_call>([^\\s<]+)\\s*(.*?)</tool_call>", re.DOTALL\n'
    assert added in text
    target.write_text(text.replace(added, added.replace("re.DOTALL", "re.DOTALL ("), 1))
    site = tmp_path / "site"
    shutil.copytree(pristine / "vllm", site / "vllm")

    result = run_script(broken, site)

    assert result.returncode != 0
    assert "a patched module does not compile" in result.stderr


# --- F04: k_scale / v_scale skip in Glm4MoeModel.load_weights -----------------------------


class _Param:
    def __init__(self, loads: list[tuple[str, Any]], name: str) -> None:
        self.weight_loader = lambda _param, weight, *args, **kwargs: loads.append((name, weight))


class _OnceLogger:
    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def load_weights(
    tree: Path, param_names: Iterable[str], weights: list[tuple[str, str]]
) -> tuple[set[str], list[tuple[str, Any]]]:
    """Run vLLM's Glm4MoeModel.load_weights (from `tree`) over named stand-in tensors."""
    remap_ns: dict[str, Any] = {"logger": _OnceLogger()}
    remap = compile_function(
        module_function(tree / WEIGHT_UTILS, "maybe_remap_kv_scale_name"), remap_ns
    )
    loads: list[tuple[str, Any]] = []
    params = [(name, _Param(loads, name)) for name in param_names]
    namespace: dict[str, Any] = {
        "typing": typing,
        "Callable": Callable,
        "get_spec_layer_idx_from_weight_name": lambda config, name: None,
        "is_pp_missing_parameter": lambda name, model: False,
        "maybe_remap_kv_scale_name": remap,
        "default_weight_loader": lambda param, weight: None,
    }
    method = compile_function(
        class_method(tree / GLM4_MOE, "Glm4MoeModel", "load_weights"), namespace
    )
    model = SimpleNamespace(
        config=SimpleNamespace(n_routed_experts=0),
        named_parameters=lambda: params,
        get_expert_mapping=lambda: [],
    )
    return method(model, weights), loads


# Seed 000's checkpoint: attention projections, and k/v scales the model has no parameter for.
NVFP4_WEIGHTS = [
    ("layers.41.self_attn.q_proj.weight", "Wq"),
    ("layers.41.self_attn.k_proj.weight", "Wk"),
    ("layers.41.self_attn.k_proj.k_scale", "sk"),
    ("layers.41.self_attn.v_proj.v_scale", "sv"),
    ("layers.41.self_attn.o_proj.weight", "Wo"),
]
MODEL_PARAMS = ["layers.41.self_attn.qkv_proj.weight", "layers.41.self_attn.o_proj.weight"]


@pytest.fixture(autouse=True)
def _regex_is_re(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM imports the `regex` package inside maybe_remap_kv_scale_name; the patterns it uses
    # mean the same in the standard library's `re`.
    monkeypatch.setitem(sys.modules, "regex", re)


def test_unpatched_loader_raises_the_seed_keyerror(pristine: Path) -> None:
    with pytest.raises(KeyError, match=r"layers\.41\.self_attn\.qkv_proj\.k_scale"):
        load_weights(pristine, MODEL_PARAMS, NVFP4_WEIGHTS)


def test_patched_loader_skips_scales_the_model_does_not_hold(patched: Path) -> None:
    loaded, loads = load_weights(patched, MODEL_PARAMS, NVFP4_WEIGHTS)
    assert loaded == set(MODEL_PARAMS)
    assert loads == [
        ("layers.41.self_attn.qkv_proj.weight", "Wq"),
        ("layers.41.self_attn.qkv_proj.weight", "Wk"),
        ("layers.41.self_attn.o_proj.weight", "Wo"),
    ]


def test_patched_loader_still_loads_scales_the_model_holds(patched: Path) -> None:
    # An FP8-KV model registers attn.k_scale/v_scale: the skip must not drop them.
    params = [*MODEL_PARAMS, "layers.41.self_attn.attn.k_scale", "layers.41.self_attn.attn.v_scale"]
    loaded, loads = load_weights(patched, params, NVFP4_WEIGHTS)
    assert loaded == set(params)
    assert ("layers.41.self_attn.attn.k_scale", "sk") in loads
    assert ("layers.41.self_attn.attn.v_scale", "sv") in loads


# --- F05: Glm47MoeModelToolParser regexes -------------------------------------------------

# Tool-call text in the two formats seed 000 describes.
GLM45_CALL = (
    "Let me look that up.<tool_call>get_weather\n"
    "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
)
GLM47_CALL = (
    "Let me look that up.<tool_call>get_weather"
    "<arg_key>city</arg_key><arg_value>Paris</arg_value>"
    "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
)
GLM47_TWO_CALLS = (
    "<tool_call>read_file<arg_key>path</arg_key><arg_value>/etc/hosts</arg_value></tool_call>"
    "<tool_call>list_dir<arg_key>path</arg_key>\n<arg_value>/tmp</arg_value></tool_call>"
)
GLM47_NO_ARGS = "<tool_call>get_time</tool_call>"

WEATHER_TOOLS = [
    SimpleNamespace(
        function=SimpleNamespace(
            name=name,
            parameters={"properties": {"city": {"type": "string"}, "path": {"type": "string"}}},
        )
    )
    for name in ("get_weather", "read_file", "list_dir", "get_time")
]


def parser_regex(tree: Path, relative: str, class_name: str, attribute: str) -> re.Pattern[str]:
    """The `re.compile(...)` a parser's __init__ assigns to self.<attribute>, as written."""
    call = init_assignment(tree / relative, class_name, attribute)
    assert isinstance(call, ast.Call) and isinstance(call.args[0], ast.Constant)
    flags = 0
    for flag in call.args[1:]:
        assert isinstance(flag, ast.Attribute)
        flags |= getattr(re, flag.attr)
    return re.compile(call.args[0].value, flags)


def extract_calls(tree: Path, parser_class: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    """vLLM's own GLM-4.5 extract_tool_calls (which GLM-4.7 inherits) with the detail and
    argument regexes that `parser_class` sets up in `tree`."""
    source = GLM47_PARSER if parser_class == "Glm47MoeModelToolParser" else GLM45_PARSER
    namespace: dict[str, Any] = {
        "json": json,
        "ast": ast,
        "Any": Any,
        "logger": logging.getLogger("vllm-under-test"),
        "ToolCall": SimpleNamespace,
        "FunctionCall": SimpleNamespace,
        "ExtractedToolCallInformation": SimpleNamespace,
    }
    extract = compile_function(
        class_method(tree / GLM45_PARSER, "Glm4MoeModelToolParser", "extract_tool_calls"),
        namespace,
    )
    parser = SimpleNamespace(
        tool_calls_start_token="<tool_call>",
        func_call_regex=parser_regex(
            tree, GLM45_PARSER, "Glm4MoeModelToolParser", "func_call_regex"
        ),
        func_detail_regex=parser_regex(tree, source, parser_class, "func_detail_regex"),
        func_arg_regex=parser_regex(tree, source, parser_class, "func_arg_regex"),
    )
    info = extract(parser, text, SimpleNamespace(tools=WEATHER_TOOLS))
    return [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]


WEATHER = [("get_weather", {"city": "Paris", "days": 3})]


@pytest.mark.parametrize(
    "text", [GLM45_CALL, GLM47_CALL], ids=["glm45-newline", "glm47-no-newline"]
)
def test_patched_glm47_parser_reads_both_formats(patched: Path, text: str) -> None:
    assert extract_calls(patched, "Glm47MoeModelToolParser", text) == WEATHER


def test_patched_glm47_parser_reads_several_calls_and_calls_without_arguments(
    patched: Path,
) -> None:
    assert extract_calls(patched, "Glm47MoeModelToolParser", GLM47_TWO_CALLS) == [
        ("read_file", {"path": "/etc/hosts"}),
        ("list_dir", {"path": "/tmp"}),
    ]
    assert extract_calls(patched, "Glm47MoeModelToolParser", GLM47_NO_ARGS) == [("get_time", {})]


def test_patched_regexes_are_the_seed_000_ones(patched: Path) -> None:
    detail = parser_regex(patched, GLM47_PARSER, "Glm47MoeModelToolParser", "func_detail_regex")
    args = parser_regex(patched, GLM47_PARSER, "Glm47MoeModelToolParser", "func_arg_regex")
    assert (detail.pattern, detail.flags & re.DOTALL) == (
        r"<tool_call>([^\s<]+)\s*(.*?)</tool_call>",
        re.DOTALL,
    )
    assert (args.pattern, args.flags & re.DOTALL) == (
        r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>",
        re.DOTALL,
    )


def test_without_the_patch_one_of_the_formats_breaks(pristine: Path) -> None:
    # 0.15.1's glm47 pattern keeps GLM-4.5's newline inside the function name ...
    assert extract_calls(pristine, "Glm47MoeModelToolParser", GLM45_CALL) == [
        ("get_weather\n", {"city": "Paris", "days": 3})
    ]
    # ... and the inherited GLM-4.5 pattern finds no call in GLM-4.7 text at all.
    assert extract_calls(pristine, "Glm4MoeModelToolParser", GLM47_CALL) == []


def test_glm47_is_a_registered_tool_call_parser_name(patched: Path) -> None:
    # `--tool-call-parser glm47` resolves through this table; 0.15.1 already has the entry,
    # so the patch only changes the class behind it.
    tree = ast.parse((patched / PARSER_REGISTRY).read_text())
    registry = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "_TOOL_PARSERS_TO_REGISTER" for t in node.targets)
    )
    module, class_name = ast.literal_eval(registry)["glm47"]
    assert (module, class_name) == ("glm47_moe_tool_parser", "Glm47MoeModelToolParser")
    parser = ast.parse((patched / f"vllm/tool_parsers/{module}.py").read_text())
    assert class_name in {node.name for node in parser.body if isinstance(node, ast.ClassDef)}


# --- F06: Anthropic /v1/messages converters -----------------------------------------------


class _Model:
    """Stands in for vLLM's pydantic protocol models: keeps its fields, dumps them as JSON."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields

    def model_dump_json(self, exclude_unset: bool = False, exclude_none: bool = False) -> str:
        return json.dumps(_plain(self, exclude_none))


def _plain(value: Any, exclude_none: bool) -> Any:
    if isinstance(value, _Model):
        return {
            key: _plain(item, exclude_none)
            for key, item in value.fields.items()
            if not (exclude_none and item is None)
        }
    if isinstance(value, list):
        return [_plain(item, exclude_none) for item in value]
    return value


def _chunk_from_json(data: str) -> SimpleNamespace:
    """A chat completion chunk with the defaults vLLM's pydantic models give missing fields."""
    raw = json.loads(data)
    choices = []
    for choice in raw["choices"]:
        delta = {"content": None, "tool_calls": [], **choice["delta"]}
        calls = [
            SimpleNamespace(
                id=call.get("id"),
                function=SimpleNamespace(**{"name": None, "arguments": None, **call["function"]})
                if "function" in call
                else None,
            )
            for call in delta["tool_calls"] or []
        ]
        if delta["tool_calls"] is not None:
            delta["tool_calls"] = calls
        choices.append(
            SimpleNamespace(
                delta=SimpleNamespace(**delta), finish_reason=choice.get("finish_reason")
            )
        )
    usage = raw.get("usage")
    return SimpleNamespace(
        id=raw["id"],
        model=raw["model"],
        choices=choices,
        usage=SimpleNamespace(**usage) if usage else None,
    )


def anthropic_namespace(tree: Path) -> dict[str, Any]:
    source = tree / ANTHROPIC
    namespace: dict[str, Any] = {
        "json": json,
        "logger": logging.getLogger("vllm-under-test"),
        "ChatCompletionStreamResponse": SimpleNamespace(model_validate_json=_chunk_from_json),
    }
    for name in (
        "AnthropicStreamEvent",
        "AnthropicMessagesResponse",
        "AnthropicUsage",
        "AnthropicContentBlock",
        "AnthropicDelta",
        "AnthropicError",
    ):
        namespace[name] = _Model
    compile_function(module_function(source, "wrap_data_with_event"), namespace)
    return namespace


def serving_self(tree: Path) -> SimpleNamespace:
    stop_map = init_assignment(tree / ANTHROPIC, "AnthropicServingMessages", "stop_reason_map")
    return SimpleNamespace(stop_reason_map=ast.literal_eval(stop_map))


def stream_events(tree: Path, chunks: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Run vLLM's message_stream_converter over OpenAI chunks; return (event, data) pairs."""
    converter = compile_function(
        class_method(tree / ANTHROPIC, "AnthropicServingMessages", "message_stream_converter"),
        anthropic_namespace(tree),
    )

    async def openai_stream() -> AsyncIterator[str]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    async def collect() -> list[str]:
        return [item async for item in converter(serving_self(tree), openai_stream())]

    events = []
    for item in asyncio.run(collect()):
        if item.startswith("event: "):
            head, data = item.split("\n", 1)
            events.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "glm-4.7",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


ROLE = _chunk({"role": "assistant", "content": ""})
WEATHER_ARGS = '{"city": "Paris", "days": 3}'
# What vLLM's chat serving sends when the GLM tool parser finishes a call: the whole call in
# one chunk, next to an empty content string.
TOOL_CALL = _chunk(
    {
        "content": "",
        "tool_calls": [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": WEATHER_ARGS},
            }
        ],
    }
)
FINISH = _chunk({"content": ""}, finish_reason="tool_calls")
USAGE = {
    "id": "chatcmpl-1",
    "model": "glm-4.7",
    "choices": [],
    "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42},
}


def _summary(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for event, data in events:
        if event == "content_block_start":
            block = data["content_block"]
            rows.append((event, data["index"], block["type"], block.get("name")))
        elif event == "content_block_delta":
            delta = data["delta"]
            rows.append((event, data["index"], delta.get("text") or delta.get("partial_json")))
        elif event == "content_block_stop":
            rows.append((event, data["index"]))
        elif event == "message_delta":
            rows.append((event, data["delta"]["stop_reason"]))
        else:
            rows.append((event,))
    return rows


def test_patched_stream_returns_a_tool_call_sent_with_empty_content(patched: Path) -> None:
    events = stream_events(
        patched, [ROLE, _chunk({"content": "Let me check."}), TOOL_CALL, FINISH, USAGE]
    )
    assert _summary(events) == [
        ("message_start",),
        ("content_block_start", 0, "text", None),
        ("content_block_delta", 0, "Let me check."),
        ("content_block_stop", 0),
        ("content_block_start", 1, "tool_use", "get_weather"),
        ("content_block_delta", 1, WEATHER_ARGS),
        ("content_block_stop", 1),
        ("message_delta", "tool_use"),
        ("message_stop",),
    ]


def test_patched_stream_tool_call_as_first_block(patched: Path) -> None:
    events = stream_events(patched, [ROLE, TOOL_CALL, FINISH, USAGE])
    assert _summary(events)[1:4] == [
        ("content_block_start", 0, "tool_use", "get_weather"),
        ("content_block_delta", 0, WEATHER_ARGS),
        ("content_block_stop", 0),
    ]


def test_patched_stream_still_streams_arguments_sent_in_pieces(patched: Path) -> None:
    start = _chunk(
        {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "get_weather"}}]}
    )
    pieces = [
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
        for part in ('{"city": ', '"Paris"}')
    ]
    events = stream_events(patched, [ROLE, start, *pieces, FINISH, USAGE])
    assert _summary(events)[1:5] == [
        ("content_block_start", 0, "tool_use", "get_weather"),
        ("content_block_delta", 0, '{"city": '),
        ("content_block_delta", 0, '"Paris"}'),
        ("content_block_stop", 0),
    ]


def test_patched_stream_passes_over_a_chunk_with_neither_content_nor_tool_calls(
    patched: Path,
) -> None:
    # tool_calls: null (seed 000, bug 2) must not reach len().
    events = stream_events(
        patched, [ROLE, _chunk({"content": None, "tool_calls": None}), FINISH, USAGE]
    )
    assert [event for event, _ in events] == ["message_start", "message_delta", "message_stop"]


def tool_calls_checked_first(tree: Path) -> bool:
    """Whether the streaming dispatch tests delta.tool_calls in the `if` whose `elif` tests
    delta.content (the order seed 000 asks for), read from the function's syntax tree."""
    method = class_method(tree / ANTHROPIC, "AnthropicServingMessages", "message_stream_converter")
    for node in ast.walk(method):
        if not isinstance(node, ast.If) or "tool_calls" not in ast.unparse(node.test):
            continue
        following = node.orelse[0] if len(node.orelse) == 1 else None
        return isinstance(following, ast.If) and ast.unparse(following.test).endswith(
            "content is not None"
        )
    return False


def test_stream_dispatch_checks_tool_calls_before_content(patched: Path, pristine: Path) -> None:
    assert tool_calls_checked_first(patched)
    assert not tool_calls_checked_first(pristine)


def test_without_the_patch_the_stream_drops_the_tool_call(pristine: Path) -> None:
    events = stream_events(
        pristine, [ROLE, _chunk({"content": "Let me check."}), TOOL_CALL, FINISH, USAGE]
    )
    summary = _summary(events)
    assert not any(row[0] == "content_block_start" and row[2] == "tool_use" for row in summary)
    assert ("message_delta", "tool_use") in summary  # the client is told to use a tool it never got


def test_without_the_patch_a_whole_tool_call_loses_its_arguments(pristine: Path) -> None:
    # Even with content absent (so the tool branch is reached), 0.15.1 opens the tool_use
    # block and never sends the arguments that came in the same chunk.
    whole = _chunk({"tool_calls": TOOL_CALL["choices"][0]["delta"]["tool_calls"]})
    events = stream_events(pristine, [ROLE, whole, FINISH, USAGE])
    assert _summary(events)[1:3] == [
        ("content_block_start", 0, "tool_use", "get_weather"),
        ("content_block_stop", 0),
    ]


def full_response(tree: Path, tool_calls: list[Any] | None) -> Any:
    converter = compile_function(
        class_method(tree / ANTHROPIC, "AnthropicServingMessages", "messages_full_converter"),
        anthropic_namespace(tree),
    )
    response = SimpleNamespace(
        id="chatcmpl-2",
        model="glm-4.7",
        usage=SimpleNamespace(prompt_tokens=5, completion_tokens=7),
        choices=[
            SimpleNamespace(
                finish_reason="tool_calls" if tool_calls else "stop",
                message=SimpleNamespace(content="Sunny.", tool_calls=tool_calls),
            )
        ],
    )
    return converter(serving_self(tree), response)


def test_patched_full_response_without_tool_calls(patched: Path) -> None:
    result = full_response(patched, None)
    assert [block.fields for block in result.content] == [{"type": "text", "text": "Sunny."}]


def test_patched_full_response_with_tool_calls(patched: Path) -> None:
    call = SimpleNamespace(
        id="call_9", function=SimpleNamespace(name="get_weather", arguments=WEATHER_ARGS)
    )
    result = full_response(patched, [call])
    assert [block.fields for block in result.content] == [
        {"type": "text", "text": "Sunny."},
        {
            "type": "tool_use",
            "id": "call_9",
            "name": "get_weather",
            "input": {"city": "Paris", "days": 3},
        },
    ]
    assert result.stop_reason == "tool_use"


def test_without_the_patch_full_response_fails_on_none_tool_calls(pristine: Path) -> None:
    with pytest.raises(TypeError, match="NoneType"):
        full_response(pristine, None)


def test_the_pinned_engine_commit_is_the_one_the_released_wheel_states(pristine: Path) -> None:
    # setuptools-scm writes the build's commit into vllm/_version.py as 'g<commit>'
    version_file = (pristine / "vllm" / "_version.py").read_text()
    match = re.search(r"^__commit_id__ = commit_id = '(g[0-9a-f]+)'$", version_file, re.M)
    assert match is not None
    # the 0.15.1 image is a variant's since the default moved to 0.16.0 (test_glm47_v016.py)
    pinned = load_recipe("glm47").variants["seed-pinned"].image
    assert pinned is not None and pinned.engine_version == VERSION
    assert pinned.engine_commit == match.group(1).removeprefix("g")
