"""sm120.plan.request: what a command's inputs become, and which .env it reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120.core.errors import PlanError
from sm120.plan.request import plan_request, split_variants


def test_variants_split_on_commas_and_repeats() -> None:
    assert split_variants(["a,b", " c ", ",,", "d"]) == ("a", "b", "c", "d")


def test_no_env_file_and_none_here_reads_nothing(tmp_path: Path) -> None:
    request = plan_request("tiny", environ={"SM120_PORT": "8123", "PATH": "/bin"})
    assert request.dotenv == {}
    assert request.environ == {"SM120_PORT": "8123", "PATH": "/bin"}


def test_the_env_file_here_is_read(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("PORT=8001\n")  # the tests run in tmp_path
    assert plan_request("tiny", environ={}).dotenv == {"PORT": "8001"}


def test_env_file_wins_over_the_one_here(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("PORT=8001\n")
    other = tmp_path / "other.env"
    other.write_text("PORT=8002\n")
    assert plan_request("tiny", environ={}, env_file=other).dotenv == {"PORT": "8002"}


def test_a_missing_env_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"missing\.env"):
        plan_request("tiny", environ={}, env_file=tmp_path / "missing.env")


def test_command_line_values_are_carried() -> None:
    request = plan_request(
        "tiny",
        environ={},
        variants=["a,b"],
        sets=["max-model-len=4096"],
        model_dir="/m",
        port=9000,
        host="0.0.0.0",
        no_think=True,
        force=["S02"],
    )
    assert (request.variants, request.sets, request.force) == (
        ("a", "b"),
        ("max-model-len=4096",),
        ("S02",),
    )
    assert (request.model_dir, request.port, request.host, request.thinking) == (
        "/m",
        9000,
        "0.0.0.0",
        False,
    )
    assert plan_request("tiny", environ={}).thinking is None


def test_settings_handed_in_replace_the_env_file(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("PORT=8001\n")
    assert plan_request("tiny", environ={}, dotenv={"PORT": "8003"}).dotenv == {"PORT": "8003"}
    assert plan_request("tiny", environ={}, dotenv={}).dotenv == {}


def test_the_served_name_is_carried() -> None:
    assert plan_request("tiny", environ={}, served_name="fast").served_name == "fast"
    assert plan_request("tiny", environ={}).served_name is None
