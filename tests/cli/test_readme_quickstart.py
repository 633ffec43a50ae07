"""The README's quickstart states what a newcomer measured: its times within 2x and the
engine's size within 20% of benchmarks/results/newcomer.json (written by
benchmarks/newcomer.py --record, which runs the README's commands in a fresh home; too slow
and too large for CI, so CI checks the statements against its record)."""

from __future__ import annotations

import json
import sys

import pytest

from sm120.engine.engine_env import ENGINE_DISK_GIB
from tests.helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from newcomer import RECORDED, Claims, broken_claims, readme_claims

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_quickstart_matches_the_recorded_newcomer_run() -> None:
    claims = readme_claims(README)
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    assert broken_claims(claims, recorded) == []
    assert claims.command.endswith("sm120 launch tiny")
    assert recorded["command"].startswith(claims.command)


def test_the_install_question_states_the_size_the_readme_does() -> None:
    assert readme_claims(README).engine_gib == ENGINE_DISK_GIB


@pytest.mark.parametrize(
    ("measured", "broken"),
    [
        ({"first_run_s": 243, "warm_s": 40, "engine_bytes": 3.5e9}, []),
        (
            {"first_run_s": 500, "warm_s": 40, "engine_bytes": 3.5e9},
            ["first run: README says 240s, measured 500s"],
        ),
        (
            {"first_run_s": 243, "warm_s": 20, "engine_bytes": 3.5e9},
            ["warm start: README says 45s, measured 20s"],
        ),
        (
            {"first_run_s": 243, "warm_s": 40, "engine_bytes": 1.6e9},
            ["engine: README says 3.4 GiB, measured 1.49"],
        ),
    ],
)
def test_a_statement_off_by_more_than_its_margin_is_named(
    measured: dict[str, float], broken: list[str]
) -> None:
    claims = Claims(first_run_s=240, engine_gib=3.4, warm_s=45, command="")
    assert broken_claims(claims, measured) == broken


def test_a_readme_that_stops_stating_a_figure_is_caught() -> None:
    without = README.replace("later launches are ready in about", "later launches are quick,")
    with pytest.raises(ValueError, match="no longer states the warm start"):
        readme_claims(without)
