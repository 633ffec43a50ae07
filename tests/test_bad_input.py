"""Bad input, command by command: every value a careless or hostile user could pass gets one
line on stderr (with a hint), a non-zero exit and no traceback.

The numeric table is built from the Typer app itself: a new int or float option without a
range in sm120/cli/bounds.py fails here, and each bounded option is tried with NaN,
infinity, a huge value and values just outside its range.
"""

from __future__ import annotations

import inspect
import math
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.models import ArgumentInfo, OptionInfo
from typer.testing import CliRunner

from sm120.cli.app import app
from sm120.cli.bounds import BOUNDS, Bound, bound_for, numeric_options
from tests.conftest import REPO, invoke


def one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


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
    for name, param in inspect.signature(inspect.unwrap(callback)).parameters.items():
        info = param.default
        if isinstance(info, OptionInfo | ArgumentInfo) and flag in (info.param_decls or ()):
            return "float" in str(param.annotation)
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
            "(hint: e.g. --gpus 4)",
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
_SHAPE_HINT = "recipes are a few levels deep; check the brackets and indentation"
BAD_RECIPES = [
    pytest.param(
        _alias_bomb(),
        "{path}: the recipe expands to more than 100,000 values (hint: YAML aliases (*name) "
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
        "conversion) (hint: check the numbers in the recipe)",
        id="5000-digits",
    ),
    pytest.param(
        TINY.replace("name: tiny", "name: " + "a" * 300, 1),
        "{path}: name: String should have at most 64 characters (hint: fix the value in the "
        "recipe)",
        id="300-character-name",
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
        ("Tiny\x00", "Tiny\x00"),
    ],
    ids=["dot-dot", "absolute", "inner-dot-dot", "10000-characters", "65-characters", "empty", "nul"],
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
        "doctor": ["doctor", name, "--from", str(REPO / "tests")],
    }[command]
    code, _, err = invoke(cli, *args)
    assert (code, one_line_error(err)) == (
        2,
        f"Error: '{shown}' is not a recipe name: {_NAME_RULE} (hint: {_NAME_HINT})",
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
