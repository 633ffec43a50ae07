from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sm120.engine.tiny_model import (
    CHAT_TEMPLATE_FILE,
    TinyModelError,
    default_tiny_model_dir,
    ensure_tiny_model,
)

CHECK_MODEL = """
import json, sys
from transformers import AutoTokenizer
model_dir = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
text = "Hello, world! Ünïcödé and   spaces .\\nsecond line"
ids = tokenizer.encode(text, add_special_tokens=False)
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
print(json.dumps({
    "round_trip": tokenizer.decode(ids),
    "n_ids": len(ids),
    "vocab": len(tokenizer),
    "chat": tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
    "chat_no_prompt": tokenizer.apply_chat_template(messages, tokenize=False),
    "role_token_ids": tokenizer.convert_tokens_to_ids(["<|user|>", "<|assistant|>"]),
    "unk_id": tokenizer.unk_token_id,
    "with_tools": tokenizer.apply_chat_template(
        [messages[1], CALLED, {"role": "tool", "content": "sunny"}], tools=[TOOL], tokenize=False
    ),
}))
"""
# What a tool round trip looks like once vLLM has turned the call's arguments into a dict.
TOOLS_PREAMBLE = """
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
"""
CHECK_MODEL = TOOLS_PREAMBLE + CHECK_MODEL
TOOL_SENT = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}


def test_default_dir_is_under_home(isolated_home: Path) -> None:
    assert default_tiny_model_dir() == isolated_home / "models" / "tiny"


def test_existing_model_is_reused_without_running_the_builder(tmp_path: Path) -> None:
    dest = tmp_path / "tiny"
    dest.mkdir()
    (dest / "config.json").write_text("{}")
    missing_python = tmp_path / "no-python-here"
    assert ensure_tiny_model(missing_python, dest, lambda line: None) == dest


def test_an_older_chat_template_is_brought_up_to_the_shipped_one(tmp_path: Path) -> None:
    dest = tmp_path / "tiny"
    dest.mkdir()
    (dest / "config.json").write_text("{}")
    (dest / "chat_template.jinja").write_text("{{ bos_token }}{% for m in messages %}{% endfor %}")
    progress: list[str] = []
    ensure_tiny_model(tmp_path / "no-python-here", dest, progress.append)
    assert (dest / "chat_template.jinja").read_text() == CHAT_TEMPLATE_FILE.read_text()
    assert progress == [f"updating the tiny model's chat template in {dest}"]
    ensure_tiny_model(tmp_path / "no-python-here", dest, progress.append)
    assert len(progress) == 1  # already current: nothing rewritten


def test_builder_failure_shows_its_last_lines(tmp_path: Path) -> None:
    # sm120's own interpreter has no torch: a real failure of the real builder.
    with pytest.raises(TinyModelError) as caught:
        ensure_tiny_model(Path(sys.executable), tmp_path / "tiny", lambda line: None)
    assert caught.value.message.startswith("building the tiny model failed (exit 1):\n")
    assert caught.value.message.endswith("ModuleNotFoundError: No module named 'torch'")
    assert not (tmp_path / "tiny").exists()


def test_unrunnable_engine_python_is_named(tmp_path: Path) -> None:
    missing_python = tmp_path / "no-python-here"
    with pytest.raises(TinyModelError) as caught:
        ensure_tiny_model(missing_python, tmp_path / "tiny", lambda line: None)
    assert caught.value.message.startswith(f"cannot run {missing_python}:")


@pytest.mark.integration
def test_tiny_model_loads_in_the_engine_python(tmp_path: Path, engine_python: Path) -> None:
    progress: list[str] = []
    dest = ensure_tiny_model(engine_python, tmp_path / "tiny", progress.append)

    config = json.loads((dest / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["head_dim"] == 64
    assert config["num_key_value_heads"] == 2
    assert config["num_hidden_layers"] == 2
    assert config["tie_word_embeddings"] is False
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    assert config["max_position_embeddings"] == 4096
    assert (dest / "model.safetensors").is_file()
    assert (dest / "generation_config.json").is_file()
    assert not (tmp_path / "tiny.partial").exists()
    assert f"tiny model written to {dest}" in progress

    checked = subprocess.run(
        [str(engine_python), "-c", CHECK_MODEL, str(dest)],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(checked.stdout.splitlines()[-1])
    assert report["round_trip"] == "Hello, world! Ünïcödé and   spaces .\nsecond line"
    assert report["vocab"] == config["vocab_size"] == 512
    assert report["chat"] == ("<s><|system|>\nBe brief.</s>\n<|user|>\nHi?</s>\n<|assistant|>\n")
    assert report["chat_no_prompt"] == "<s><|system|>\nBe brief.</s>\n<|user|>\nHi?</s>\n"
    tools_turn, rest = report["with_tools"].split("</s>\n", 1)
    assert tools_turn.startswith("<s><|system|>\n# Tools\n")
    assert json.dumps(TOOL_SENT) in tools_turn
    assert rest == (
        "<|user|>\nHi?</s>\n<|assistant|>\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call></s>\n'
        "<|user|>\n<tool_response>\nsunny\n</tool_response></s>\n"
    )
    assert (dest / "chat_template.jinja").read_text() == CHAT_TEMPLATE_FILE.read_text()
    assert len(set(report["role_token_ids"])) == 2
    assert report["unk_id"] not in report["role_token_ids"]


@pytest.mark.integration
def test_builds_are_byte_identical(tmp_path: Path, engine_python: Path) -> None:
    first = ensure_tiny_model(engine_python, tmp_path / "a", lambda line: None)
    second = ensure_tiny_model(engine_python, tmp_path / "b", lambda line: None)
    names = sorted(path.name for path in first.iterdir())
    assert names == sorted(path.name for path in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
