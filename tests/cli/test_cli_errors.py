"""Bad input: one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import REPO, invoke, one_line_error


def test_unknown_recipe(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "glm5", "--dry-run")
    assert code == 2
    assert one_line_error(err) == (
        "Error: unknown recipe 'glm5'; did you mean 'glm52'? (hint: run 'sm120 recipes' "
        "to list them)"
    )


def test_bad_set(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "glm52", "--dry-run", "--set", "max-model-lenn=5")
    assert code == 2
    assert "unknown key 'max-model-lenn'; did you mean 'max-model-len'?" in one_line_error(err)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: broken\ntitle: [unclosed\n", "line 3: malformed YAML"),
        ("name: broken\nname: again\n", "duplicate key 'name' at line 2"),
        ("name: broken\ntitel: x\n", "unknown key 'titel'; did you mean 'title'?"),
        ("- a list\n", "a recipe must be a YAML mapping"),
    ],
)
def test_validate_malformed_recipes(
    cli: CliRunner, tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path / "broken.yaml", text)
    code, _, err = invoke(cli, "validate", str(path))
    assert code == 2
    assert message in one_line_error(err)


def test_validate_unknown_nested_key(cli: CliRunner, tmp_path: Path) -> None:
    source = (REPO / "recipes" / "tiny.yaml").read_text()
    path = write(tmp_path / "tiny.yaml", source.replace("served_name:", "servedname:"))
    code, _, err = invoke(cli, "validate", str(path))
    assert code == 2
    assert "unknown key 'model.servedname'; did you mean 'served_name'?" in one_line_error(err)


def test_validate_unknown_flag_in_recipe(cli: CliRunner, tmp_path: Path) -> None:
    source = (REPO / "recipes" / "tiny.yaml").read_text()
    path = write(tmp_path / "tiny.yaml", source.replace("max-num-seqs:", "max-num-seq:"))
    code, _, err = invoke(cli, "validate", str(path))
    assert code == 2
    assert "unknown vllm flag 'max-num-seq'; did you mean 'max-num-seqs'?" in one_line_error(err)


def test_validate_why_note_for_nothing(cli: CliRunner, tmp_path: Path) -> None:
    source = (REPO / "recipes" / "tiny.yaml").read_text()
    path = write(tmp_path / "tiny.yaml", source.replace('  dtype: "the CPU', '  dtyp: "the CPU'))
    code, _, err = invoke(cli, "validate", str(path))
    assert code == 2
    assert "why-note for 'dtyp'" in one_line_error(err)


def test_validate_a_figure_read_at_a_branch_tip(cli: CliRunner, tmp_path: Path) -> None:
    source = (REPO / "recipes" / "glm47.yaml").read_text()
    pinned = "https://github.com/AlexGS74/glm47-nvfp4-sm120/blob/2a4692d/README.md"
    moving = "https://github.com/AlexGS74/glm47-nvfp4-sm120/blob/main/README.md"
    path = write(tmp_path / "glm47.yaml", source.replace(f"source: {pinned}", f"source: {moving}"))
    code, _, err = invoke(cli, "validate", str(path))
    assert code == 2
    assert one_line_error(err) == (
        f"Error: {path}: glm47 default: the decode figure's source {moving} names a branch or "
        "tag, not a commit (link the commit it was read at) (hint: a published figure names "
        "the commit of the page it was read in, or a thread)"
    )


def test_validate_all_bundled(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "validate")
    assert code == 0
    assert [line.split()[1] for line in out.splitlines()] == [
        "dsv4",
        "dsv41",
        "dsv4vision",
        "glm47",
        "glm52",
        "glm53flash",
        "kimik3",
        "qwen38flash",
        "tiny",
    ]


def test_dry_run_rule_failure_exits_1_and_says_why(cli: CliRunner) -> None:
    code, out, _ = invoke(
        cli,
        "launch",
        "glm47",
        "--dry-run",
        "--gpus",
        "4",
        "--arch",
        "sm_120",
        "--set",
        "kv-cache-dtype=nvfp4",
    )
    assert code == 1
    assert "FAIL F07 kv-cache-dtype nvfp4 has no sm_120 kernel" in " ".join(out.split())


def test_launch_refuses_a_failing_plan_with_one_line(cli: CliRunner) -> None:
    code, _, err = invoke(
        cli,
        "launch",
        "glm47",
        "--gpus",
        "4",
        "--arch",
        "sm_120",
        "--set",
        "attention-backend=triton",
    )
    assert code == 2
    line = one_line_error(err)
    assert line.startswith("Error: [F02] unknown attention backend 'triton'")
    assert "--force F02" in line


def test_dry_run_json_contract(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "launch", "glm52", "--dry-run", "--json", "--variant", "dcp2")
    assert code == 0
    doc = json.loads(out)
    for key in ("recipe", "variant", "image", "argv", "env", "plan_hash", "rules"):
        assert key in doc
    assert doc["recipe"] == "glm52" and doc["variant"] == "dcp2"
    assert isinstance(doc["argv"], list) and doc["argv"][1:3] == [
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    assert doc["env"]["NCCL_P2P_DISABLE"] == "1"
    assert {r["id"] for r in doc["rules"]} >= {"F02", "F07", "F11", "F13", "F14", "F17"}


def test_env_file_option(cli: CliRunner, tmp_path: Path) -> None:
    env = write(tmp_path / "custom.env", "DCP_SIZE=2\nPORT=8123\n")
    code, out, _ = invoke(cli, "launch", "glm52", "--dry-run", "--json", "--env-file", str(env))
    doc = json.loads(out)
    assert code == 0
    assert doc["endpoint"] == "http://127.0.0.1:8123/v1"
    assert doc["provenance"]["args.decode-context-parallel-size"] == ".env"


def test_recipes_json(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "recipes", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0
    assert rows["glm47"]["revision"] == "531df318db"
    assert rows["glm52"]["gpus"] == 4 and rows["glm52"]["hardware"] == "sm_120"
    assert rows["tiny"]["gpus"] == 0


def test_recipes_show(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "recipes", "show", "glm52", "--variant", "dcp1")
    text = " ".join(out.split())
    assert code == 0
    assert "--decode-context-parallel-size 1" in text
    assert "131,072 is the safe cap, ~177k OOMs (F08)" in text


def test_version(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "--version")
    assert (code, out.strip()) == (0, "sm120 0.1.0")
