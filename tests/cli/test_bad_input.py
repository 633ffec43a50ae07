"""Bad input, command by command: every value a careless or hostile user could pass gets one
line on stderr (with a hint), a non-zero exit and no traceback.

The numeric table is built from the Typer app itself: a new int or float option without a
range in sm120/cli/bounds.py fails here, and each bounded option is tried with NaN,
infinity, a huge value and values just outside its range.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, cast

import pytest
from typer.testing import CliRunner

from sm120.cli.app import app
from sm120.cli.bounds import BOUNDS, Bound, bound_for, declared_options, numeric_options
from sm120.engine.state import DeploymentState, save_state
from tests.fakes.loopback_server import LoopbackServer
from tests.helpers import REPO, invoke, one_line_error

# --- every numeric option of the CLI ---------------------------------------------------------


def _commands(typer_app: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    callback = typer_app.registered_callback
    if callback is not None and path:
        yield path, callback.callback
    for command in typer_app.registered_commands:
        yield (*path, command.name or command.callback.__name__), command.callback
    for group in typer_app.registered_groups:
        yield from _commands(group.typer_instance, (*path, group.name))


def _numeric() -> list[tuple[tuple[str, ...], str, Callable[..., Any]]]:
    found = []
    for path, callback in _commands(app):
        for flag in numeric_options(inspect.unwrap(callback)).values():
            found.append((path, flag, callback))
    return found


NUMERIC = _numeric()
# What each command needs besides the option to reach the range check.
_LEADING = {
    ("launch",): ["tiny", "--dry-run"],
    ("plan",): ["tiny", "--gpus", "1"],
    ("compose",): ["tiny"],
    ("doctor",): [],
    ("chat",): ["hi"],
    ("test",): ["core"],
    ("eval", "gsm8k"): [],
    ("tune",): ["tiny"],
    ("gateway", "keys", "add"): ["ann"],
    ("logs", "parse"): ["-"],
}


def test_the_walk_finds_the_numeric_options() -> None:
    flags = {(" ".join(path), flag) for path, flag, _ in NUMERIC}
    # A floor, so a broken walk cannot pass by finding nothing.
    assert {("plan", "--gpus"), ("launch", "--timeout"), ("logs", "--lines")} <= flags
    assert len(flags) >= 20


@pytest.mark.parametrize(
    ("path", "flag", "callback"), NUMERIC, ids=[f"{' '.join(p)} {f}" for p, f, _ in NUMERIC]
)
def test_every_numeric_option_has_a_range(
    path: tuple[str, ...], flag: str, callback: Callable[..., Any]
) -> None:
    function = inspect.unwrap(callback)
    assert bound_for(function.__name__, flag) is not None, (
        f"{' '.join(path)} {flag} has no range: add it to BOUNDS in sm120/cli/bounds.py"
    )
    # The range is checked by cli_errors, which every command wears.
    assert callback is not function, f"{' '.join(path)} is not wrapped in cli_errors"


def _is_float(callback: Callable[..., Any], flag: str) -> bool:
    for _name, decls, kind in declared_options(inspect.unwrap(callback)):
        if flag in decls:
            return "float" in str(kind)
    raise AssertionError(f"{flag} not found")


def _words(number: float) -> str:
    if not isinstance(number, float):
        return str(number)
    short = f"{number:g}"
    return short if float(short) == number else repr(number)


def _bad_values(bound: Bound, is_float: bool) -> list[tuple[str, str]]:
    """(value as typed, the 'must be ...' words its error holds)."""
    low = _words(bound.low)
    high = _words(bound.high)
    below = f"more than {low}" if bound.open_low else f"{low} or more"
    above = f"less than {high}" if bound.open_high else f"{high} or less"
    step = 0.5 if is_float else 1
    under = bound.low if bound.open_low else bound.low - step
    over = bound.high if bound.open_high else bound.high + step
    cases = [
        (_words(under if is_float else int(under)), below),
        (_words(over if is_float else int(over)), above),
        ("1" + "0" * 30, above),
        ("-" + "9" * 30, below),
    ]
    if is_float:
        cases += [("nan", "a finite number"), ("inf", "a finite number")]
        cases += [("-inf", "a finite number"), ("1e308", above)]
    return cases


_TRIES = [
    (path, flag, value, words)
    for path, flag, callback in NUMERIC
    for value, words in _bad_values(
        bound_for(inspect.unwrap(callback).__name__, flag) or Bound(0, 0, ""),
        _is_float(callback, flag),
    )
]


@pytest.mark.parametrize(
    ("path", "flag", "value", "words"),
    _TRIES,
    ids=[f"{' '.join(p)} {f} {v[:12]}" for p, f, v, _ in _TRIES],
)
def test_numeric_option_out_of_range(
    cli: CliRunner, path: tuple[str, ...], flag: str, value: str, words: str
) -> None:
    args = [*path, *_LEADING.get(path, []), f"{flag}={value}"]
    code, out, err = invoke(cli, *args)
    line = one_line_error(err)
    assert code == 2, (args, out, err)
    assert line.startswith(f"Error: {flag} must be {words}, got "), line
    assert "(hint: " in line


def test_every_bound_names_a_real_option() -> None:
    flags = {flag for _, flag, _ in NUMERIC} | {"--lengths"}
    for key in BOUNDS:
        assert key.split()[-1] in flags, f"BOUNDS has {key}, which no command takes"


def test_bounds_are_sane() -> None:
    for key, bound in BOUNDS.items():
        assert math.isfinite(bound.low) and math.isfinite(bound.high), key
        assert bound.low < bound.high, key
        assert bound.hint, key


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("plan", "glm52", "--gpus", "100000"),
            "Error: --gpus must be 64 or less, got 100000 (hint: e.g. --gpus 4)",
        ),
        (
            ("launch", "tiny", "--dry-run", "--gpus", "1" + "0" * 30),
            "Error: --gpus must be 64 or less, got 100000000000... (31 digits) "
            "(hint: 0 for a CPU-only machine, e.g. --gpus 4)",
        ),
        (
            ("plan", "glm52", "--gpus", "8", "--kv-memory-gib", "nan"),
            "Error: --kv-memory-gib must be a finite number, got nan "
            "(hint: take it from the engine's 'Available KV cache memory' line)",
        ),
        (
            ("plan", "glm52", "--gpus", "8", "--gpu-mem-gib", "1e308"),
            "Error: --gpu-mem-gib must be 4096 or less, got 1e+308 "
            "(hint: an RTX PRO 6000 has 94.97 GiB)",
        ),
        (
            ("launch", "tiny", "--timeout", "-5"),
            "Error: --timeout must be 1 or more, got -5 "
            "(hint: seconds to wait for READY, e.g. --timeout 3600)",
        ),
        (
            ("compose", "tiny", "--port", "0"),
            "Error: --port must be 1 or more, got 0 (hint: use a port from 1 to 65535, e.g. 8000)",
        ),
        (
            ("logs", "-n", "1" + "0" * 20),
            "Error: --lines must be 1000000 or less, got 100000000000000000000 (hint: e.g. -n 50)",
        ),
        (
            ("bench", "--lengths", "1024,100000000"),
            "Error: --lengths must be 16777216 or less, got 100000000 "
            "(hint: prompt tokens, e.g. --lengths 1024,8192)",
        ),
    ],
)
def test_issue_numbers(cli: CliRunner, args: tuple[str, ...], message: str) -> None:
    code, _, err = invoke(cli, *args)
    assert (code, one_line_error(err)) == (2, message)


# --- recipes ----------------------------------------------------------------------------------

TINY = (REPO / "recipes" / "tiny.yaml").read_text(encoding="utf-8")


def _alias_bomb() -> str:
    """Nine levels of ten aliases each: 10**9 strings once expanded, a few lines of YAML."""
    lines = ["  hf-overrides:", '    l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        lines.append(f"    l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 10) + "]")
    return TINY.replace("\nargs:\n", "\nargs:\n" + "\n".join(lines) + "\n", 1)


def _recipe_line(line: str) -> str:
    return TINY.replace("\nargs:\n", f"\nargs:\n  {line}\n", 1)


# The line _recipe_line writes: the one after "args:".
_INJECTED_LINE = TINY.split("\n").index("args:") + 2
_SHAPE_HINT = "settings nest a few levels deep; check the brackets and indentation"
BAD_RECIPES = [
    pytest.param(
        _alias_bomb(),
        "{path}: the YAML expands to more than 100,000 values (hint: YAML aliases (*name) "
        "repeat what they point at; write the values out instead)",
        id="alias-bomb",
    ),
    pytest.param(
        _recipe_line("hf-overrides: " + "[" * 40 + "]" * 40),
        f"{{path}}: line {_INJECTED_LINE}: nested deeper than 32 levels (hint: {_SHAPE_HINT})",
        id="nested-40",
    ),
    pytest.param(
        _recipe_line("hf-overrides: " + "[" * 10_000 + "]" * 10_000),
        f"{{path}}: line {_INJECTED_LINE}: nested deeper than 32 levels (hint: {_SHAPE_HINT})",
        id="nested-10000",
    ),
    pytest.param(
        _recipe_line("max-num-batched-tokens: " + "9" * 5000),
        "{path}: a value YAML cannot read (Exceeds the limit (4300 digits) for integer string "
        "conversion) (hint: check the numbers)",
        id="5000-digits",
    ),
    pytest.param(
        TINY.replace("name: tiny", "name: " + "a" * 300, 1),
        "{path}: name: String should have at most 64 characters (hint: fix the value in the "
        "recipe)",
        id="300-character-name",
    ),
    pytest.param(
        _recipe_line("? [a, b]\n  : 1"),
        f"{{path}}: line {_INJECTED_LINE}: a key that is a list or mapping (hint: keys are "
        "plain names, e.g. max-model-len)",
        id="list-as-key",
    ),
    pytest.param(
        TINY.replace("size_gb: 0.002", "size_gb: .inf", 1),
        "{path}: model.size_gb: Input should be a finite number (hint: fix the value in the "
        "recipe)",
        id="infinite-size",
    ),
    pytest.param(
        TINY.replace("size_gb: 0.002", "size_gb: -5", 1),
        "{path}: model.size_gb: Input should be greater than or equal to 0 (hint: fix the value "
        "in the recipe)",
        id="negative-size",
    ),
    pytest.param(
        TINY.replace("  gpus: 0\n", "  gpus: 18446744073709551616\n", 1),
        "{path}: hardware.gpus: Input should be less than or equal to 64 (hint: fix the value in "
        "the recipe)",
        id="2**64-gpus",
    ),
    pytest.param(
        b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe binary",
        "recipe {path} is not UTF-8 text (byte 0) (hint: a recipe is a small UTF-8 YAML file; "
        "see recipes/ for examples)",
        id="binary",
    ),
    pytest.param(
        TINY.replace("\nargs:\n", "\n# " + "x" * (1 << 20) + "\nargs:\n", 1),
        "recipe {path} is larger than 1 MiB (hint: a recipe is a small UTF-8 YAML file; "
        "see recipes/ for examples)",
        id="over-1-MiB",
    ),
]


def _recipes_folder(tmp_path: Path, content: str | bytes, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir()
    path = folder / "tiny.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    monkeypatch.setenv("SM120_RECIPES_DIR", str(folder))
    return path


@pytest.mark.parametrize(("content", "message"), BAD_RECIPES)
@pytest.mark.parametrize("command", ["launch", "validate", "plan", "recipes show"])
def test_bad_recipe_files(
    cli: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    content: str | bytes,
    message: str,
    command: str,
) -> None:
    path = _recipes_folder(tmp_path, content, monkeypatch)
    args = {
        "launch": ["launch", "tiny", "--dry-run"],
        "validate": ["validate", str(path)],
        "plan": ["plan", "tiny", "--gpus", "1"],
        "recipes show": ["recipes", "show", "tiny"],
    }[command]
    code, _, err = invoke(cli, *args)
    assert (code, one_line_error(err)) == (2, "Error: " + message.format(path=path))


def test_a_recipe_that_is_a_device_is_bounded(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "validate", "/dev/zero")
    assert (code, one_line_error(err)) == (
        2,
        "Error: recipe /dev/zero is larger than 1 MiB (hint: a recipe is a small UTF-8 YAML "
        "file; see recipes/ for examples)",
    )


def test_the_bundled_recipes_stay_within_the_bounds(cli: CliRunner) -> None:
    # dsv4 uses aliases for its dims: the bound must leave honest aliases alone.
    code, out, err = invoke(cli, "validate")
    assert code == 0, err
    assert "ok  dsv4" in out


_NAME_HINT = "run 'sm120 recipes' to list them; 'sm120 validate FILE' checks a file"
_NAME_RULE = "lowercase letters, digits and '-', at most 64 characters"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("../recipes/tiny", "../recipes/tiny"),
        (str(REPO / "recipes" / "tiny"), str(REPO / "recipes" / "tiny")),
        ("tiny/../tiny", "tiny/../tiny"),
        ("a" * 10_000, "a" * 40 + "... (10000 characters)"),
        ("a" * 65, "a" * 40 + "... (65 characters)"),
        ("", ""),
        ("Tiny\x00", "Tiny"),  # a control character never reaches the terminal
    ],
    ids=[
        "dot-dot",
        "absolute",
        "inner-dot-dot",
        "10000-characters",
        "65-characters",
        "empty",
        "nul",
    ],
)
@pytest.mark.parametrize("command", ["launch", "plan", "compose", "recipes show", "doctor"])
def test_recipe_names_are_names_not_paths(
    cli: CliRunner, name: str, shown: str, command: str
) -> None:
    args = {
        "launch": ["launch", name, "--dry-run"],
        "plan": ["plan", name, "--gpus", "1"],
        "compose": ["compose", name],
        "recipes show": ["recipes", "show", name],
        "doctor": ["doctor", name, "--from", "/dev/null"],
    }[command]
    code, _, err = invoke(cli, *args)
    assert (code, one_line_error(err)) == (
        2,
        f"Error: '{shown}' is not a recipe name: {_NAME_RULE} (hint: {_NAME_HINT})",
    )


def test_a_recipes_folder_that_is_a_file_is_an_error(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SM120_RECIPES_DIR", str(REPO / "recipes" / "tiny.yaml"))
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run")
    assert (code, one_line_error(err)) == (
        2,
        f"Error: the recipes folder {REPO / 'recipes' / 'tiny.yaml'} is not a folder "
        "(hint: fix or unset SM120_RECIPES_DIR)",
    )


def test_a_missing_recipes_folder_is_an_error(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SM120_RECIPES_DIR", "/nonexistent")
    message = (
        "Error: the recipes folder /nonexistent does not exist "
        "(hint: fix or unset SM120_RECIPES_DIR)"
    )
    for args in (["recipes"], ["launch", "tiny", "--dry-run"], ["validate"]):
        code, out, err = invoke(cli, *args)
        assert (code, out, one_line_error(err)) == (2, "", message), args


# --- .env ---------------------------------------------------------------------------------------

_ENV_TYPO_HINT = "fix the name (see .env.example); a misspelled setting would be ignored"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "MAX_MODEL_LENN=4096\n",
            f"unknown setting 'MAX_MODEL_LENN' in .env; did you mean 'MAX_MODEL_LEN'? "
            f"(hint: {_ENV_TYPO_HINT})",
        ),
        (
            "TP_SZE=2\n",
            f"unknown setting 'TP_SZE' in .env; did you mean 'TP_SIZE'? (hint: {_ENV_TYPO_HINT})",
        ),
        (
            "VARIANTS=no-think\n",
            f"unknown setting 'VARIANTS' in .env; did you mean 'VARIANT'? (hint: {_ENV_TYPO_HINT})",
        ),
        (
            "max_model_len=4096\n",
            f"unknown setting 'max_model_len' in .env; did you mean 'MAX_MODEL_LEN'? "
            f"(hint: {_ENV_TYPO_HINT})",
        ),
        (
            b"\xff\xfe\x00binary",
            ".env file {path} is not UTF-8 text (byte 0) (hint: check --env-file)",
        ),
        (
            "PORT=7\x00\n",
            ".env file {path} is not text (it holds NUL bytes) (hint: check --env-file)",
        ),
        (
            "# " + "x" * 300_000 + "\n",
            ".env file {path} is larger than 256 KiB (hint: check --env-file)",
        ),
        ("PORT=0\n", "PORT=0 is not a port from 1 to 65535 (hint: use e.g. 8000)"),
        (
            "PORT=" + "9" * 5000 + "\n",
            "PORT='" + "9" * 40 + "' is not a port number (hint: use e.g. 8000)",
        ),
        (
            "JUST SOME TEXT\n",
            "{path}:1: expected KEY=VALUE, got 'JUST SOME TEXT' (hint: fix the line)",
        ),
    ],
    ids=[
        "typo-len",
        "typo-tp",
        "typo-variant",
        "lowercase",
        "binary",
        "nul",
        "huge",
        "port-0",
        "port-digits",
        "no-equals",
    ],
)
@pytest.mark.parametrize("command", ["launch", "doctor"])
def test_bad_env_files(
    cli: CliRunner, tmp_path: Path, content: str | bytes, message: str, command: str
) -> None:
    path = tmp_path / "bad.env"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    args = {
        "launch": ["launch", "tiny", "--dry-run", "--env-file", str(path)],
        "doctor": ["doctor", "tiny", "--env-file", str(path), "--from", "/dev/null"],
    }[command]
    code, _, err = invoke(cli, *args)
    assert (code, one_line_error(err)) == (2, "Error: " + message.format(path=path))


def test_env_names_that_are_not_typos_pass(cli: CliRunner, tmp_path: Path) -> None:
    # compose's env_file hands the whole .env to the container: other names are allowed.
    path = tmp_path / "ok.env"
    path.write_text(
        "HF_TOKEN=x\nHOSTNAME=box\nIMAGE=sm120/tiny:local\nBIND_HOST=127.0.0.1\n"
        "http_proxy=http://proxy:3128\nCUDA_VISIBLE_DEVICES=0\nNCCL_P2P_DISABLE=1\n"
    )
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", "--env-file", str(path))
    assert (code, err) == (0, "")


def test_a_device_as_env_file_is_bounded(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", "--env-file", "/dev/zero")
    assert (code, one_line_error(err)) == (
        2,
        "Error: .env file /dev/zero is larger than 256 KiB (hint: check --env-file)",
    )


# --- doctor --from ------------------------------------------------------------------------------

CORPUS = REPO / "tests" / "data" / "nvidia_smi"
_FROM_HINT = "pass the text nvidia-smi printed (a few KB), not a log or an archive"
_NOTHING_HINT = (
    "paste what 'nvidia-smi', 'nvidia-smi topo -m' or 'nvidia-smi --query-gpu=index,name,"
    "compute_cap,memory.total,memory.used --format=csv' printed"
)


def _fifo_fed_with(tmp_path: Path, data: bytes) -> tuple[Path, threading.Thread]:
    """A FIFO a thread writes `data` into (as `--from <(ssh box nvidia-smi)` would be)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def feed() -> None:
        try:
            with fifo.open("wb") as handle:
                for start in range(0, len(data), 1 << 16):
                    handle.write(data[start : start + (1 << 16)])
        except BrokenPipeError:
            pass  # the reader stopped at its bound

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    return fifo, writer


def test_from_a_device_is_bounded_by_bytes_read(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "doctor", "--from", "/dev/zero")
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: --from: /dev/zero is larger than 5 MiB (hint: {_FROM_HINT})",
    )


def test_from_an_endless_fifo_is_bounded(cli: CliRunner, tmp_path: Path) -> None:
    fifo, writer = _fifo_fed_with(tmp_path, b"x" * (6 << 20))
    code, _, err = invoke(cli, "doctor", "--from", str(fifo))
    writer.join(timeout=10)
    assert (code, one_line_error(err)) == (
        2,
        f"Error: --from: {fifo} is larger than 5 MiB (hint: {_FROM_HINT})",
    )


def test_from_a_fifo_of_real_output_works(cli: CliRunner, tmp_path: Path) -> None:
    capture = (CORPUS / "rtx_5090_2x_610_kmd_table.txt").read_bytes()
    fifo, writer = _fifo_fed_with(tmp_path, capture)
    code, out, err = invoke(cli, "doctor", "--from", str(fifo), "--json")
    writer.join(timeout=10)
    assert code in (0, 1), err
    assert "table" in json.loads(out)["kinds"]


@pytest.mark.parametrize(
    "content",
    [
        b"+-----+-----+\n| a   | b   |\n+-----+-----+\n",
        b"+----------------+\n| Results        |\n+================+\n"
        b"| 3 tests passed |\n+----------------+\n",
        b"",
        bytes(range(256)) * 64,
    ],
    ids=["ascii-box", "result-box", "empty", "binary"],
)
def test_from_input_without_gpu_output_is_refused(
    cli: CliRunner, tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "capture.txt"
    path.write_bytes(content)
    code, out, err = invoke(cli, "doctor", "tiny", "--from", str(path))
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: no nvidia-smi output recognised in {path} (hint: {_NOTHING_HINT})",
    )


# --- chat against a server that answers badly ---------------------------------------------------


class _BadServer(BaseHTTPRequestHandler):
    """Answers every POST with the bytes `answer` yields, under `content_type`."""

    content_type = "text/event-stream"
    answer: Callable[[], Iterator[bytes]] = staticmethod(lambda: iter(()))

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.end_headers()
        try:
            for part in type(self).answer():
                self.wfile.write(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up at its bound

    def log_message(self, *_args: object) -> None:
        pass


def _chunk(delta: dict[str, Any]) -> bytes:
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _endless_line(size: int) -> Iterator[bytes]:
    yield b"data: "
    block = b"x" * (1 << 20)
    for _ in range(size // len(block)):
        yield block


def _huge_json(size: int) -> Iterator[bytes]:
    yield b'{"choices": [{"message": {"content": "'
    block = b"x" * (1 << 20)
    for _ in range(size // len(block)):
        yield block
    yield b'"}}]}'


_NOT_OURS = "this is not what vLLM or SGLang send; check what listens on that port"
_OPENAI = "check that an OpenAI-compatible server (vLLM, SGLang) listens on that port"
BAD_STREAMS = [
    pytest.param(
        "text/plain",
        lambda: iter([b"hello from some other web server\n", b"<html></html>\n"]),
        [],
        "Error: /v1/chat/completions answered with text that is not an event stream: "
        f"hello from some other web server (hint: {_OPENAI})",
        id="plain-text",
    ),
    pytest.param(
        "text/event-stream",
        lambda: iter([_chunk({"content": "half an ans"})]),
        [],
        "Error: the /v1/chat/completions stream ended before [DONE] "
        "(hint: the server may have crashed mid-answer; check its log)",
        id="no-done",
    ),
    pytest.param(
        "text/event-stream",
        lambda: iter([_chunk({"content": 42}), b"data: [DONE]\n\n"]),
        [],
        f"Error: the stream sent a delta whose 'content' is int, not text (hint: {_OPENAI})",
        id="int-content",
    ),
    pytest.param(
        "text/event-stream",
        lambda: iter([_chunk({"content": ["a", "b"]}), b"data: [DONE]\n\n"]),
        [],
        f"Error: the stream sent a delta whose 'content' is list, not text (hint: {_OPENAI})",
        id="list-content",
    ),
    pytest.param(
        "text/event-stream",
        lambda: iter([b'data: {"choices": "abc"}\n\n', b"data: [DONE]\n\n"]),
        [],
        "Error: the stream sent 'choices' that are not a list of objects",
        id="string-choices",
    ),
    pytest.param(
        "text/event-stream",
        lambda: _endless_line(10 << 20),
        [],
        f"Error: /v1/chat/completions streamed a line longer than 8 MiB (hint: {_NOT_OURS})",
        id="endless-line",
    ),
    pytest.param(
        "application/json",
        lambda: _huge_json(40 << 20),
        ["--no-stream"],
        f"Error: /v1/chat/completions answered with more than 32 MiB (hint: {_NOT_OURS})",
        id="huge-body",
    ),
]


@pytest.fixture
def bad_server(isolated_home: Path) -> Iterator[type[_BadServer]]:
    handler = type("Handler", (_BadServer,), {})
    with LoopbackServer(handler) as server:
        port = int(server.url.rsplit(":", 1)[1])
        _deployment_at(isolated_home, port)
        yield handler


def _deployment_at(home: Path, port: int) -> None:
    folder = home / "deployments" / "tiny"
    (folder / "logs").mkdir(parents=True)
    save_state(
        DeploymentState(
            name="tiny",
            recipe="tiny",
            runtime="native",
            supervisor_pid=os.getpid(),
            engine_pid=None,
            host="127.0.0.1",
            port=port,
            plan_hash="abc",
            started_at=0.0,
            log_path=str(folder / "logs" / "serve.log"),
            exit_file=str(folder / "exit.json"),
            served_model_name="tiny",
            model_dir=None,
            api_key_file=None,
        )
    )


@pytest.mark.parametrize(("content_type", "answer", "extra", "message"), BAD_STREAMS)
def test_chat_refuses_a_bad_answer(
    cli: CliRunner,
    bad_server: type[_BadServer],
    content_type: str,
    answer: Callable[[], Iterator[bytes]],
    extra: list[str],
    message: str,
) -> None:
    bad_server.content_type = content_type
    bad_server.answer = staticmethod(answer)
    code, _, err = invoke(cli, "chat", "hello", *extra)
    assert (code, one_line_error(err)) == (2, message)


def _endless_stream() -> Iterator[bytes]:
    """Well-formed content events that never end (each 64 KiB of text)."""
    event = _chunk({"content": "y" * (1 << 16)})
    while True:
        yield event


def _one_line_byte_by_byte(size: int) -> Iterator[bytes]:
    yield b"data: "
    for _ in range(size // 512):
        yield b"x" * 512


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (_endless_stream, "streamed more than 32 MiB"),
        (lambda: _one_line_byte_by_byte(9 << 20), "streamed a line longer than 8 MiB"),
    ],
    ids=["endless-stream", "line-in-small-chunks"],
)
def test_chat_bounds_a_stream_in_bytes_and_stays_linear(
    cli: CliRunner,
    bad_server: type[_BadServer],
    answer: Callable[[], Iterator[bytes]],
    message: str,
) -> None:
    bad_server.answer = staticmethod(answer)
    started = time.monotonic()
    code, _, err = invoke(cli, "chat", "hello")
    # Linear: the line sent in 512-byte pieces re-joined its growing prefix per piece before
    # (minutes of copying); the endless stream grew the answer without limit.
    assert time.monotonic() - started < 20
    assert (code, one_line_error(err)) == (
        2,
        f"Error: /v1/chat/completions {message} (hint: {_NOT_OURS})",
    )


def test_chat_strips_terminal_escapes_from_the_answer(
    cli: CliRunner, bad_server: type[_BadServer]
) -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m\r\x9b2Jok\n"
    events = [
        _chunk({"reasoning_content": "\x1b[2Jthink"}),
        _chunk({"content": hostile}),
        _chunk({"content": "\x1b"}),  # a sequence split across two deltas
        _chunk({"content": "[2Jsplit"}),
        b"data: [DONE]\n\n",
    ]
    bad_server.answer = staticmethod(lambda: iter(events))
    code, out, err = invoke(cli, "chat", "hello")
    assert (code, out) == (0, "redok\n[2Jsplit\n")
    assert "\x1b" not in err and "think" in err
    bad_server.answer = staticmethod(
        lambda: iter([b'data: {"error": {"message": "\\u001b]0;t\\u0007bad"}}\n\n'])
    )
    code, _, err = invoke(cli, "chat", "hello")
    assert code == 2 and "\x1b" not in err and "bad" in err


class _SilentServer(BaseHTTPRequestHandler):
    """Takes the request, then sends no headers (`stall_after` None) or stops after a first
    event (`stall_after` the bytes sent), holding the connection open."""

    stall_after: bytes | None = None
    release = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.stall_after is not None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(self.stall_after)
            self.wfile.flush()
        type(self).release.wait(30)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("stall_after", "waited"),
    [(None, "STREAM_HEADERS_S"), (_chunk({"content": "half"}), "STREAM_STALL_S")],
    ids=["no-headers", "stalls-mid-answer"],
)
def test_chat_gives_up_on_a_silent_server(
    cli: CliRunner,
    isolated_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    stall_after: bytes | None,
    waited: str,
) -> None:
    from sm120.server import transport

    # Both bounds shortened so the test is quick; each is the one that must end the wait.
    monkeypatch.setattr(transport, "STREAM_HEADERS_S", 0.5 if waited == "STREAM_HEADERS_S" else 9)
    monkeypatch.setattr(transport, "STREAM_STALL_S", 0.5 if waited == "STREAM_STALL_S" else 9)
    fields = {"stall_after": stall_after, "release": threading.Event()}
    handler = cast(type[_SilentServer], type("Handler", (_SilentServer,), fields))
    with LoopbackServer(handler) as server:
        port = int(server.url.rsplit(":", 1)[1])
        _deployment_at(isolated_home, port)
        started = time.monotonic()
        code, _, err = invoke(cli, "chat", "hello")
        elapsed = time.monotonic() - started
        handler.release.set()
    assert elapsed < 5
    assert code == 2
    assert one_line_error(err).startswith(
        f"Error: /v1/chat/completions on http://127.0.0.1:{port} did not answer"
    )


def test_chat_takes_a_well_formed_stream(cli: CliRunner, bad_server: type[_BadServer]) -> None:
    # The same server, answering properly: the checks above refuse only what is broken.
    bad_server.answer = staticmethod(
        lambda: iter([b": keep-alive\n\n", _chunk({"content": "hi"}), b"data: [DONE]\n\n"])
    )
    code, out, err = invoke(cli, "chat", "hello")
    assert (code, out.strip()) == (0, "hi")
    assert err.startswith("[TTFT "), err


def test_chat_refuses_a_binary_piped_prompt(cli: CliRunner) -> None:
    result = cli.invoke(app, ["chat"], input=b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    assert (result.exit_code, one_line_error(result.stderr)) == (
        2,
        "Error: the piped prompt is not UTF-8 text (byte 0) "
        "(hint: pipe UTF-8 text, e.g. cat notes.txt | sm120 chat)",
    )


# --- logs, monitor --plot, compose -o ----------------------------------------------------------


def test_logs_cut_a_runaway_line(cli: CliRunner, isolated_home: Path) -> None:
    from sm120.engine.log_follow import CUT_MARK, MAX_LINE_BYTES

    _deployment_at(isolated_home, 1)
    log = isolated_home / "deployments" / "tiny" / "logs" / "serve.log"
    log.write_bytes(b"first\n" + b"y" * (3 * MAX_LINE_BYTES) + b"\nlast\n")
    code, out, err = invoke(cli, "logs", "-n", "3")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines == ["first", "y" * MAX_LINE_BYTES + CUT_MARK, "last"]


def test_logs_parse_cuts_a_runaway_line(cli: CliRunner, tmp_path: Path) -> None:
    from sm120.logs.logparse import MAX_LINE_CHARS

    log = tmp_path / "serve.log"
    stats = (
        "INFO 11-21 00:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 10.0 tokens/s, "
        "Avg generation throughput: 20.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%\n"
    )
    log.write_text("z" * (3 * MAX_LINE_CHARS) + "\n" + stats)
    code, out, err = invoke(cli, "logs", "parse", str(log), "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    # The runaway line is read as one (cut) line and the stats after it are still found.
    assert [event["kind"] for event in events] == ["stats"]
    assert err.strip().startswith("2 lines, 1 events")


def test_follower_cuts_a_runaway_line(tmp_path: Path) -> None:
    from sm120.engine.log_follow import CUT_MARK, MAX_LINE_BYTES, LogFollower

    log = tmp_path / "serve.log"
    log.write_bytes(b"")
    follower = LogFollower(log)
    with log.open("ab") as handle:
        handle.write(b"a" * (MAX_LINE_BYTES // 2))
        handle.flush()
        assert follower.read_lines() == []
        handle.write(b"a" * (2 * MAX_LINE_BYTES))
        handle.flush()
        assert follower.read_lines() == ["a" * MAX_LINE_BYTES + CUT_MARK]
        handle.write(b"a" * MAX_LINE_BYTES + b" end of it\nnext\n")
        handle.flush()
        assert follower.read_lines() == ["next"]
    follower.close()


def test_monitor_plot_of_a_binary_history_is_one_line(
    cli: CliRunner, isolated_home: Path, tmp_path: Path
) -> None:
    _deployment_at(isolated_home, 1)
    from sm120.monitor.files import MonitorFiles

    history = MonitorFiles(isolated_home / "deployments" / "tiny").history
    history.parent.mkdir(parents=True, exist_ok=True)
    history.write_bytes(bytes(range(256)) * 512 + b'{"t": "x", "decode_tps": [1]}\n')
    code, _, err = invoke(cli, "monitor", "--plot", str(tmp_path / "plot.png"))
    assert (code, one_line_error(err)) == (
        2,
        "Error: no throughput history yet for tiny (hint: the monitor records a sample every "
        "poll once the server is up; try again later)",
    )


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("/nonexistent/compose.yaml", "No such file or directory"),
        ("/", "Is a directory"),
        ("/dev/full", "No space left on device"),
    ],
)
def test_compose_to_a_bad_path(cli: CliRunner, target: str, reason: str) -> None:
    code, out, err = invoke(cli, "compose", "tiny", "-o", target)
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: cannot write {target}: {reason} (hint: pass -o a file in a folder that exists "
        "and is writable, or leave -o out)",
    )


# --- other files a user hands over: gate cases, a checkpoint's config.json ---------------------


def test_cases_file_that_is_a_device(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "test", "core", "--cases", "/dev/zero")
    assert (code, one_line_error(err)) == (
        2,
        "Error: --cases /dev/zero is larger than 4 MiB (hint: check --cases)",
    )


def test_cases_file_alias_bomb(cli: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "cases.yaml"
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 10) + "]" for n in range(1, 10)]
    path.write_text("\n".join(lines) + "\nsuites: {}\n")
    code, _, err = invoke(cli, "test", "core", "--cases", str(path))
    assert (code, one_line_error(err)) == (
        2,
        f"Error: {path}: the YAML expands to more than 100,000 values (hint: YAML aliases "
        "(*name) repeat what they point at; write the values out instead)",
    )


def test_a_huge_checkpoint_config(cli: CliRunner, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    with (model / "config.json").open("wb") as handle:
        handle.truncate(17 << 20)  # sparse: costs no disk
    code, _, err = invoke(cli, "plan", "glm52", "--gpus", "4", "--model-dir", str(model))
    assert (code, one_line_error(err)) == (
        2,
        f"Error: checkpoint config {model / 'config.json'} is larger than 16 MiB "
        "(hint: re-download the checkpoint)",
    )


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (
            lambda: iter([b"<html>not a stream</html>\n"]),
            "/v1/chat/completions answered with text that is not an event stream: "
            "<html>not a stream</html>",
        ),
        (
            lambda: iter([_chunk({"content": "cut"})]),
            "the /v1/chat/completions stream ended before [DONE]",
        ),
        (
            lambda: _endless_line(10 << 20),
            "/v1/chat/completions streamed a line longer than 8 MiB",
        ),
        (
            lambda: iter([b'data: {"choices": [{"delta": "text"}]}\n\n', b"data: [DONE]\n\n"]),
            'the stream sent a chunk of an unexpected shape: {"choices": [{"delta": "text"}]}',
        ),
    ],
    ids=["not-a-stream", "no-done", "endless-line", "string-delta"],
)
def test_gates_and_benchmarks_record_a_bad_stream_as_a_failed_exchange(
    answer: Callable[[], Iterator[bytes]], error: str
) -> None:
    from sm120.server.wire import Wire

    handler = type("Handler", (_BadServer,), {"answer": staticmethod(answer)})
    with LoopbackServer(handler) as server, Wire(server.url, None, timeout=30) as wire:
        exchange = wire.chat([{"role": "user", "content": "hi"}], "tiny")
    assert exchange.error == error


# --- --set values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("assignment", "failure"),
    [
        (
            "max-model-len=" + "1" + "0" * 30,
            "max-model-len must be at most 2147483647, got 100000000000... (31 digits)",
        ),
        ("max-num-seqs=2147483648", "max-num-seqs must be at most 2147483647, got 2147483648"),
        ("max-num-seqs=-5", "max-num-seqs must be at least 1, got -5"),
    ],
    ids=["10e30", "int32-plus-1", "negative"],
)
def test_set_counts_out_of_range_fail_a_rule(cli: CliRunner, assignment: str, failure: str) -> None:
    code, out, _ = invoke(cli, "launch", "tiny", "--dry-run", "--set", assignment)
    assert code == 1
    assert f"FAIL   S04 {failure}" in out


def test_set_value_of_the_wrong_type(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", "--set", "max-model-len=nan")
    assert (code, one_line_error(err)) == (
        2,
        "Error: max-model-len expects a int value, got 'nan' "
        "(hint: check the value's type (e.g. numbers without quotes))",
    )


# --- deployment names ---------------------------------------------------------------------------

_DEPLOYMENT_HINT = "use letters, digits, '.', '_' or '-', starting with a letter or digit"


@pytest.mark.parametrize("name", ["../x", "/etc", "a b", "-rf", "x\x00y"])
@pytest.mark.parametrize("command", ["logs", "stop", "status", "chat"])
def test_deployment_names_are_names_not_paths(cli: CliRunner, name: str, command: str) -> None:
    args = ["chat", "hi"] if command == "chat" else [command]
    code, out, err = invoke(cli, *args, "--name", name)
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: invalid deployment name {name!r} (hint: {_DEPLOYMENT_HINT})",
    )


def _set_bomb() -> str:
    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 10) + "]" for n in range(1, 9)]
    return "hf-overrides={" + ", ".join(levels) + "}"


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        (
            _set_bomb(),
            "Error: --set hf-overrides: the YAML expands to more than 100,000 values (hint: YAML "
            "aliases (*name) repeat what they point at; write the values out instead)",
        ),
        (
            "hf-overrides=" + "[" * 5000 + "]" * 5000,
            "Error: --set hf-overrides: line 1: nested deeper than 32 levels "
            f"(hint: {_SHAPE_HINT})",
        ),
        (
            "max-num-seqs=" + "9" * 5000,
            "Error: --set max-num-seqs: a value YAML cannot read (Exceeds the limit (4300 digits) "
            "for integer string conversion) (hint: check the numbers)",
        ),
    ],
    ids=["alias-bomb", "nested-5000", "5000-digits"],
)
def test_set_values_are_bounded_like_recipes(cli: CliRunner, assignment: str, message: str) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", "--set", assignment)
    assert (code, one_line_error(err)) == (2, message)


# --- the bounded readers themselves -------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "lines"),
    [
        (b"abc\n0123456789\nx\n", [b"abc", b"01234", b"x"]),
        (b"0123456789", [b"01234"]),
        (b"\n\nab", [b"", b"", b"ab"]),
        (b"a" * 200_000 + b"\nnext\n", [b"aaaaa", b"next"]),
        (b"abcde\nfghij", [b"abcde", b"fghij"]),
    ],
    ids=["mixed", "one-long-no-newline", "blank-lines", "long-across-blocks", "exact-length"],
)
def test_capped_lines(data: bytes, lines: list[bytes]) -> None:
    import io

    from sm120.core.bounded import capped_lines

    assert list(capped_lines(io.BytesIO(data), 5)) == lines


def test_read_capped_counts_bytes_read_not_the_reported_size(tmp_path: Path) -> None:
    from sm120.core.bounded import InputTooLarge, read_capped

    assert read_capped(Path("/dev/null"), 10, "input", "hint") == b""
    with pytest.raises(InputTooLarge) as caught:
        read_capped(Path("/dev/zero"), 10, "input", "use a file")
    assert caught.value.one_line() == "input /dev/zero is larger than 10 bytes (hint: use a file)"
    exact = tmp_path / "ten"
    exact.write_bytes(b"0123456789")
    assert read_capped(exact, 10, "input", "hint") == b"0123456789"


def test_the_benchmark_load_records_an_endless_event_as_a_failed_request() -> None:
    from sm120.measure.load import run_load

    handler = type(
        "Handler", (_BadServer,), {"answer": staticmethod(lambda: _endless_line(10 << 20))}
    )
    with LoopbackServer(handler) as server:
        result = run_load(server.url, None, "tiny", ["hello"], max_tokens=4, timeout=30)
    assert [timing.error for timing in result.requests] == [
        "the stream sent an event longer than 8 MiB"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("test", "agent", "--case", "x"),
            "Error: --case does not apply to the agent session (hint: use --turns N)",
        ),
        (
            ("test", "agent", "--api", "responses"),
            "Error: unknown --api 'responses' (hint: choose from: messages, chat)",
        ),
    ],
)
def test_agent_gate_bad_input(cli: CliRunner, args: tuple[str, ...], message: str) -> None:
    code, _, err = invoke(cli, *args)
    assert code == 2
    assert one_line_error(err) == message


# --- bounded in time: a FIFO nobody writes to, a device that never ends -----------------------


@pytest.fixture
def silent_fifo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A FIFO no one ever opens for writing (opening it blocking would wait forever)."""
    from sm120.core import bounded

    monkeypatch.setattr(bounded, "PIPE_WAIT_S", 0.3)
    fifo = tmp_path / "silent"
    os.mkfifo(fifo)
    return fifo


@pytest.mark.parametrize(
    ("args", "what", "hint"),
    [
        (("validate", "{f}"), "recipe", "a recipe is a small UTF-8 YAML file; see recipes/ for "
         "examples"),
        (("launch", "tiny", "--dry-run", "--env-file", "{f}"), ".env file", "check --env-file"),
        (("doctor", "--from", "{f}"), "--from:", _FROM_HINT),
        (("test", "core", "--cases", "{f}"), "--cases", "check --cases"),
    ],
    ids=["validate", "env-file", "doctor-from", "test-cases"],
)  # fmt: skip
def test_a_silent_fifo_is_refused_within_the_time_bound(
    cli: CliRunner, silent_fifo: Path, args: tuple[str, ...], what: str, hint: str
) -> None:
    started = time.monotonic()
    code, _, err = invoke(cli, *(arg.format(f=silent_fifo) for arg in args))
    assert time.monotonic() - started < 5
    assert (code, one_line_error(err)) == (
        2,
        f"Error: {what} {silent_fifo} did not end within 0.3 s (a FIFO or device?) (hint: {hint})",
    )


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_logs_parse_takes_only_regular_files(
    cli: CliRunner, silent_fifo: Path, target: str
) -> None:
    path = str(silent_fifo) if target == "fifo" else target
    code, _, err = invoke(cli, "logs", "parse", path)
    assert (code, one_line_error(err)) == (
        2,
        f"Error: {path} is not a regular file (hint: pipe a live log into '-' instead: "
        "docker logs -f NAME | sm120 logs parse -)",
    )


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_a_key_file_pointer_to_a_device_or_fifo_is_no_key(silent_fifo: Path, target: str) -> None:
    from sm120.engine.secrets import read_api_key

    started = time.monotonic()
    assert read_api_key(str(silent_fifo) if target == "fifo" else target) is None
    assert time.monotonic() - started < 2


# --- one validation of numbers and names: plan, --set, launch --dry-run, service -----------------


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("tensor-parallel-size=0", "S04: tensor-parallel-size must be at least 1, got 0"),
        (
            "gpu-memory-utilization=7",
            "S05: gpu-memory-utilization must be in (0, 1], got 7.0; the seeds use 0.80-0.95",
        ),
    ],
)
def test_plan_refuses_what_launch_refuses(cli: CliRunner, assignment: str, message: str) -> None:
    code, out, err = invoke(cli, "plan", "glm52", "--gpus", "4", "--set", assignment)
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: {message} (hint: 'sm120 launch' refuses the same value; fix it and plan again)",
    )


_SET_HINT = "check the --set / .env value"


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        (
            "model.dims.num_hidden_layers=1000000000",
            "model.dims.num_hidden_layers: Input should be less than or equal to 1024",
        ),
        ("model.weights_gib=inf", "model.weights_gib: Input should be a finite number"),
        ("model.weights_gib=nan", "model.weights_gib: Input should be a finite number"),
        (
            "model.dims.head_dim=99999999999",
            "model.dims: head_dim is 99999999999; numbers must be below 2**31",
        ),
        ("hardware.gpus=18446744073709551616", "hardware.gpus: Input should be less than or "
         "equal to 64"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["plan", "launch"])
def test_set_numbers_are_refused_fast(
    cli: CliRunner, assignment: str, message: str, command: str
) -> None:
    args = (
        ["plan", "glm52", "--gpus", "4"] if command == "plan" else ["launch", "glm52", "--dry-run"]
    )
    started = time.monotonic()
    code, _, err = invoke(cli, *args, "--set", assignment)
    # A billion layers ran for over a minute, growing memory, before the bound.
    assert time.monotonic() - started < 3
    assert (code, one_line_error(err)) == (2, f"Error: {message} (hint: {_SET_HINT})")


_SERVED_RULE = "String should match pattern '^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$'"


@pytest.mark.parametrize("served", ["a;id", "a\nb", "", "a" * 100_000, "-x", "a b"])
def test_launch_dry_run_refuses_bad_served_names(cli: CliRunner, served: str) -> None:
    started = time.monotonic()
    code, _, err = invoke(
        cli, "launch", "tiny", "--dry-run", "--set", f"model.served_name={served}"
    )
    assert time.monotonic() - started < 3
    assert (code, one_line_error(err)) == (
        2,
        f"Error: model.served_name: {_SERVED_RULE} (hint: {_SET_HINT})",
    )


@pytest.mark.parametrize("name", ["a;id", "a\nb", "", "-x"])
def test_launch_dry_run_refuses_bad_deployment_names(cli: CliRunner, name: str) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", "--name", name)
    assert (code, one_line_error(err)) == (
        2,
        f"Error: invalid deployment name {name!r} (hint: use letters, digits, '.', '_' or '-', "
        "starting with a letter or digit)",
    )


@pytest.mark.parametrize("host", ["256.1.1.1", "1.2.3.4.5", "10.0.0.999"])
@pytest.mark.parametrize("command", ["launch", "service"])
def test_hosts_that_look_like_bad_addresses(cli: CliRunner, host: str, command: str) -> None:
    args = ["launch", "tiny", "--dry-run"] if command == "launch" else ["service", "print", "tiny"]
    code, out, err = invoke(cli, *args, "--host", host)
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: --host {host!r} is not an IP address or host name (hint: use 127.0.0.1 (this "
        "machine only, the default) or 0.0.0.0 (every interface))",
    )


def test_an_ipv6_zone_id_renders_its_endpoint(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "launch", "tiny", "--dry-run", "--host", "fe80::1%lo")
    assert code == 0
    assert "endpoint  http://[fe80::1%25lo]:8000/v1  model=tiny" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--timeout", "-5"), "--timeout must be 1 or more, got -5 (hint: seconds to wait for "
         "READY, e.g. --timeout 3600)"),
        (("--port", "0"), "--port must be 1 or more, got 0 (hint: use a port from 1 to 65535, "
         "e.g. 8000)"),
        (("--gate", "nonsense"), "no gate suite 'nonsense' (hint: suites: core, long, "
         "multiturn, tools)"),
        (("--name", "a;b"), "invalid deployment name 'a;b' (hint: use letters, digits, '.', '_' "
         "or '-', starting with a letter or digit)"),
    ],
)  # fmt: skip
def test_service_print_refuses_what_launch_refuses(
    cli: CliRunner, args: tuple[str, ...], message: str
) -> None:
    code, out, err = invoke(cli, "service", "print", "tiny", *args)
    assert (code, out, one_line_error(err)) == (2, "", f"Error: {message}")


# --- writes: no device, FIFO or link replaced; read-only commands change nothing --------------


@pytest.mark.parametrize("kind", ["fifo", "link", "folder"])
def test_doctor_report_never_replaces_what_is_not_a_regular_file(
    cli: CliRunner, tmp_path: Path, kind: str
) -> None:
    # A FIFO stands in for /dev/full: as root, temp file + rename once replaced the device.
    target = tmp_path / "report.md"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "link":
        (tmp_path / "elsewhere.md").write_text("keep me")
        target.symlink_to(tmp_path / "elsewhere.md")
    else:
        target.mkdir()
    shown = {"fifo": "a device, FIFO or socket", "link": "a link", "folder": "a folder"}[kind]
    code, _, err = invoke(cli, "doctor", "--report", str(target))
    assert (code, one_line_error(err)) == (
        2,
        f"Error: {target} is {shown}, not a regular file: sm120 will not replace it "
        "(hint: name a new or regular file to write)",
    )
    if kind == "link":
        assert target.is_symlink() and (tmp_path / "elsewhere.md").read_text() == "keep me"


def _shared_home_with_a_linked_deployment(home: Path, outside: Path) -> None:
    from tests.deploy.test_stop_safety import state_document

    outside.mkdir(mode=0o755)
    outside.chmod(0o755)
    home.mkdir(mode=0o755, exist_ok=True)
    home.chmod(0o755)
    (home / "deployments").mkdir(mode=0o755)
    (home / "deployments").chmod(0o755)
    document = state_document(home / "deployments" / "demo")
    (outside / "state.json").write_text(json.dumps(document))
    (home / "deployments" / "demo").symlink_to(outside)


def _modes(*roots: Path) -> dict[str, int]:
    return {
        str(path): path.lstat().st_mode
        for root in roots
        for path in [root, *sorted(root.rglob("*"))]
    }


def test_status_changes_nothing_in_a_shared_home(
    cli: CliRunner, isolated_home: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    _shared_home_with_a_linked_deployment(isolated_home, outside)
    before = _modes(isolated_home, outside)
    for args in (("status",), ("status", "--json"), ("gateway", "status"), ("gateway", "stop")):
        code, _, err = invoke(cli, *args)
        assert code == 0, err
    # No chmod of the home, of the deployments folder or through the link; no new folder.
    assert _modes(isolated_home, outside) == before


def test_stop_refuses_a_deployment_folder_linked_out_of_the_state_tree(
    cli: CliRunner, isolated_home: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    _shared_home_with_a_linked_deployment(isolated_home, outside)
    link = isolated_home / "deployments" / "demo"
    code, _, err = invoke(cli, "stop", "demo")
    assert (code, one_line_error(err)) == (
        2,
        f"Error: {link} is a link to {outside}, outside sm120's state folder {isolated_home} "
        f"(hint: remove the link (rm {link}); sm120 makes its own folders there)",
    )
    assert sorted(p.name for p in outside.iterdir()) == ["state.json"]
    assert outside.stat().st_mode & 0o777 == 0o755


_CSV_HEADER = "index, name, compute_cap, memory.total [MiB], memory.used [MiB]\n"
_PRO6000 = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (f"0, {_PRO6000}, 12.0, 99999999999999999999 MiB, 5 MiB",
         "99,999,999,999,999,999,999 MiB of memory"),
        (f"0, {_PRO6000}, 12.0, 0 MiB, 0 MiB", "0 MiB of memory"),
        (f"0, {_PRO6000}, 12.0, 97887 MiB, 99999999 MiB", "99,999,999 MiB used of 97,887 MiB"),
        (f"0, {_PRO6000}, 999.0, 97887 MiB, 5 MiB", "compute capability 999.0"),
    ],
)  # fmt: skip
def test_from_with_absurd_gpu_rows_is_refused(
    cli: CliRunner, tmp_path: Path, row: str, problem: str
) -> None:
    # Once read as "nothing blocks": a verdict about no machine at all.
    path = tmp_path / "gpus.csv"
    path.write_text(_CSV_HEADER + row + "\n")
    code, out, err = invoke(cli, "doctor", "tiny", "--from", str(path))
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: --from: {path} shows GPU0 with {problem}, which no GPU reports "
        f"(hint: {_FROM_HINT})",
    )


def test_metrics_with_nan_or_infinity_read_as_no_reading() -> None:
    from sm120.monitor.metrics import parse_metrics

    page = (
        'vllm:num_requests_running{model_name="t"} NaN\n'
        'vllm:num_requests_waiting{model_name="t"} +Inf\n'
        'vllm:kv_cache_usage_perc{model_name="t"} -Inf\n'
        'vllm:generation_tokens_total{model_name="t"} 12\n'
    )
    snapshot = parse_metrics(page, at=0.0, mono=0.0)
    assert (snapshot.running, snapshot.waiting, snapshot.kv_usage) == (None, None, None)
    assert snapshot.counters == {"generation_tokens": 12.0}


def test_a_home_that_is_a_file_is_one_line(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home-file"
    home.write_text("")
    monkeypatch.setenv("SM120_HOME", str(home))
    code, _, err = invoke(cli, "gateway", "start", "--port", "18932")
    assert (code, one_line_error(err)) == (
        2,
        f"Error: SM120_HOME {home} is a file, not a folder (hint: point SM120_HOME at a folder "
        "(or unset it for ~/.local/state/sm120))",
    )


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ('{"returncode": 0, "signal": null, "ended_at": NaN}',
         "'ended_at' must be a time in seconds since 1970"),
        ('{"returncode": 0, "signal": null, "ended_at": 1e400}',
         "'ended_at' must be a time in seconds since 1970"),
        ('{"returncode": 0, "signal": null, "ended_at": ' + "9" * 400 + "}",
         "'ended_at' must be a time in seconds since 1970"),
        ("[" * 30_000 + "]" * 30_000, "maximum recursion depth exceeded while decoding a JSON "
         "array from a unicode string"),
        ("fifo", "it is not a regular file"),
    ],
    ids=["nan", "inf", "400-digits", "nested", "fifo"],
)  # fmt: skip
def test_an_exit_record_that_is_no_time_is_one_line(
    cli: CliRunner, isolated_home: Path, record: str, problem: str
) -> None:
    from tests.deploy.test_stop_safety import state_document, write_state

    folder = isolated_home / "deployments" / "demo"
    write_state(state_document(folder))
    exit_file = folder / "exit.json"
    if record == "fifo":
        os.mkfifo(exit_file)
    else:
        exit_file.write_text(record)
    started = time.monotonic()
    code, _, err = invoke(cli, "status", "demo")
    assert time.monotonic() - started < 5
    assert (code, one_line_error(err)) == (
        2,
        f"Error: exit record {exit_file} is unusable: {problem} (hint: delete {exit_file}; "
        "status then goes by the processes alone)",
    )


def test_a_deeply_nested_answer_is_one_line(cli: CliRunner, bad_server: type[_BadServer]) -> None:
    bad_server.content_type = "application/json"
    bad_server.answer = staticmethod(lambda: iter([b"[" * 100_000 + b"]" * 100_000]))
    code, _, err = invoke(cli, "chat", "hello", "--no-stream")
    assert (code, one_line_error(err)) == (
        2,
        "Error: /v1/chat/completions answered with a body that is not JSON",
    )
    bad_server.content_type = "text/event-stream"
    bad_server.answer = staticmethod(lambda: iter([b"data: " + b"[" * 100_000 + b"\n\n"]))
    code, _, err = invoke(cli, "chat", "hello")
    assert code == 2
    assert one_line_error(err).startswith("Error: the stream sent a line that is not JSON: [[[")


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_a_log_pointer_to_a_device_or_fifo_is_one_line(
    cli: CliRunner, isolated_home: Path, tmp_path: Path, target: str
) -> None:
    from tests.deploy.test_stop_safety import state_document, write_state

    log = target
    if target == "fifo":
        log = str(tmp_path / "log-fifo")
        os.mkfifo(log)
    write_state(state_document(isolated_home / "deployments" / "demo", log_path=log))
    started = time.monotonic()
    code, _, err = invoke(cli, "logs", "--name", "demo", "-n", "5")
    # The FIFO blocked the open forever, /dev/zero the read.
    assert time.monotonic() - started < 5
    assert (code, one_line_error(err)) == (
        2,
        f"Error: log {log} is not a regular file (hint: sm120 writes its logs itself; remove "
        "what is at that path, or the state naming it)",
    )


_REPORT = (
    "this is a bug in sm120, not in what you gave it; please report it with the output of the "
    "same command under SM120_DEBUG=1 (it shows where it failed)"
)
_OS_HINT = "check the path, its permissions and the free space"


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (OverflowError("cannot convert float infinity to integer"), 70,
         f"internal error (OverflowError: cannot convert float infinity to integer) "
         f"(hint: {_REPORT})"),
        (ZeroDivisionError("integer modulo by zero"), 70,
         f"internal error (ZeroDivisionError: integer modulo by zero) (hint: {_REPORT})"),
        (RecursionError("maximum recursion depth exceeded"), 70,
         f"internal error (RecursionError: maximum recursion depth exceeded) (hint: {_REPORT})"),
        (TypeError("unhashable type: 'list'"), 70,
         f"internal error (TypeError: unhashable type: 'list') (hint: {_REPORT})"),
        (KeyError("x"), 70, f"internal error (KeyError: 'x') (hint: {_REPORT})"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), 2,
         "input that is not UTF-8 text ('utf-8' codec can't decode byte 0xff in position 0: "
         "invalid start byte) (hint: give a UTF-8 text file (a key, a recipe, a prompt))"),
        (IsADirectoryError(21, "Is a directory", "/x"), 2,
         f"Is a directory: /x (hint: {_OS_HINT})"),
        (FileExistsError(17, "File exists"), 2, f"File exists (hint: {_OS_HINT})"),
        (PermissionError(1, "Operation not permitted", "/etc/x.json"), 2,
         f"Operation not permitted: /etc/x.json (hint: {_OS_HINT})"),
        (OSError(36, "File name too long", "/" + "a" * 300), 2,
         f"File name too long: /{'a' * 99}... (301 characters) (hint: {_OS_HINT})"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else "",
)  # fmt: skip
def test_an_unexpected_exception_is_one_honest_line_not_a_traceback(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, error: Exception, code: int, message: str
) -> None:
    # The net under every command: what the system refuses is the user's to fix (exit 2);
    # anything else is a bug in sm120 and says so (exit 70), never passing for bad input.
    from sm120.recipe import loader

    def fail(*_args: object, **_kwargs: object) -> None:
        raise error

    monkeypatch.setattr(loader, "load_recipe", fail)
    result = cli.invoke(app, ["plan", "tiny", "--gpus", "1"])
    assert (result.exit_code, result.stdout, one_line_error(result.stderr)) == (
        code,
        "",
        f"Error: {message}",
    )
    assert "Traceback" not in result.stderr


def test_sm120_debug_shows_the_traceback(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    from sm120.recipe import loader

    def fail(*_args: object, **_kwargs: object) -> None:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(loader, "load_recipe", fail)
    monkeypatch.setenv("SM120_DEBUG", "1")
    result = cli.invoke(app, ["plan", "tiny", "--gpus", "1"])
    assert isinstance(result.exception, ZeroDivisionError)


_URL_HINT = "give the server's address, e.g. http://127.0.0.1:8000"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://[::1", "'http://[::1' is not a URL (Invalid port: ':1')"),
        ("http://x:99999", "'http://x:99999' names port 99999, outside 1-65535"),
        ("ht!tp://x", "'ht!tp://x' is not an http(s) URL with a host"),
        ("http://", "'http://' is not an http(s) URL with a host"),
        ("ftp://x", "'ftp://x' is not an http(s) URL with a host"),
    ],
)
@pytest.mark.parametrize("command", ["test", "bench"])
def test_malformed_urls_are_one_line(cli: CliRunner, url: str, message: str, command: str) -> None:
    args = ["test", "core"] if command == "test" else ["bench"]
    code, _, err = invoke(cli, *args, "--url", url)
    assert (code, one_line_error(err)) == (2, f"Error: {message} (hint: {_URL_HINT})")
