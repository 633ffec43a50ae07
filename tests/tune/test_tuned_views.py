"""A kept result shown where the published figure and the roofline are: `recipes show` (text
and --json) and the dashboard's snapshot; `tune --show` redraws it without measuring."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import sm120.deploy.tuned as tuned
from sm120.dashboard.snapshot import snapshot
from sm120.deploy.tuned import save_result
from tests.helpers import invoke
from tests.tune.test_tuned import HERE, result


def kept(monkeypatch: pytest.MonkeyPatch) -> None:
    document = result(HERE)
    document.update(
        unit="tok/s",
        higher_is_better=True,
        workload_description="chat: 64 sessions, 64 requests, 774 prompt tokens each on average",
        leader={"label": "max-num-seqs=64", "value": 3064.1},
        default={"label": "default", "value": 2111.3},
        candidates=[
            {"key": "a", "label": "default", "status": "measured", "value": 2111.3,
             "samples": [2111.3]},
            {"key": "b", "label": "max-num-seqs=64", "status": "measured", "value": 3064.1,
             "samples": [3064.1]},
            {"key": "c", "label": "decode-context-parallel-size=3", "status": "skipped",
             "value": None, "samples": [], "reason": "[S01] tensor-parallel-size 1 ..."},
        ],
        pairs=[{"default": 2150.0, "leader": 3050.0, "leader_first": True}],
        saved="tiny.json",
        chart="tiny.svg",
    )  # fmt: skip
    document["winner"]["key"] = "b"
    save_result(document)
    monkeypatch.setattr(tuned, "host_fingerprint", lambda plan: dict(HERE))


def test_recipes_show_prints_it_beside_the_roofline(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept(monkeypatch)
    code, out, err = invoke(cli, "recipes", "show", "tiny")
    assert code == 0, err
    assert "tuned      tuned here on 2025-12-02, +212.5% aggregate at 64" in out
    assert "aggregate at 64: 3,064.1 tok/s tuned, 2,111.3 tok/s default" in out
    code, out, err = invoke(cli, "recipes", "show", "tiny", "--json")
    document = json.loads(out)
    assert document["tuned"]["applies_here"] is True
    assert document["tuned"]["winner"] == ["max-num-seqs=64"]


def test_recipes_show_json_has_no_tuned_key_without_a_result(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "recipes", "show", "tiny", "--json")
    assert code == 0, err
    assert "tuned" not in json.loads(out)


def test_the_dashboard_snapshot_lists_it(monkeypatch: pytest.MonkeyPatch) -> None:
    kept(monkeypatch)
    (row,) = snapshot({}, None)["tuned"]
    assert row["key"] == "tiny"
    assert row["gain"] == "+212.5% aggregate at 64 against the default"
    assert (row["tuned"], row["default"]) == (3064.1, 2111.3)
    assert row["settings"] == ["max-num-seqs=64"]
    assert row["host"] == "1x NVIDIA H200, vllm 0.26.0 (vllm/vllm-openai:v0.26.0)"


def test_tune_show_redraws_the_kept_result(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    kept(monkeypatch)
    code, out, err = invoke(cli, "tune", "tiny", "--show")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == (
        "sm120 tune tiny: aggregate at 64 (tok/s, higher is better) on chat: 64 sessions, "
        "64 requests, 774 prompt tokens each on average"
    )
    assert any(line.startswith("* max-num-seqs=64") and "3,064.10 tok/s" in line for line in lines)
    assert any(line.endswith("([S01] tensor-parallel-size 1 ...)") for line in lines)
    assert "result: +212.5% aggregate at 64 against the default" in lines
    assert "winning settings: max-num-seqs=64" in lines


def test_tune_show_without_a_result_says_what_to_run(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "tune", "tiny", "--show")
    assert code == 2
    assert err.strip() == (
        "Error: no tune result is kept for tiny on this host (hint: run 'sm120 tune tiny' first)"
    )
