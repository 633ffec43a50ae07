"""launch's weights step: it serves from a complete folder, asks before downloading (or is told
--yes), refuses an incomplete folder naming what is missing, and leaves the generated tiny
model alone. Serving itself is replaced by a recorder here; the real engine runs in
tests/integration."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.deploy.checked import CheckedPlan
from sm120.plan.resolve import PlanRequest, resolve
from sm120.weights.download import QuietEvents
from sm120.weights.download_record import read_manifest, write_manifest
from sm120.weights.ensure import WeightsIncomplete, ensure_weights, with_managed_dir
from sm120.weights.verify import verify_dir
from tests.fakes.checkpoints import checkpoint, write_files
from tests.fakes.hub import GLM47, GLM47_COMMIT, GLM52, TOKEN, FakeHub
from tests.helpers import invoke

HW = ("--gpus", "4", "--arch", "sm_120")
# What the GLM-5.2 config.json says about its sparse indexer (F09), scaled down to 4 layers.
GLM52_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "num_hidden_layers": 4,
    "indexer_types": ["full", "shared", "full", "shared"],
}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub(token=TOKEN) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(name, raising=False)
        yield server


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[CheckedPlan]:
    """Records the plan launch would serve instead of starting an engine."""
    plans: list[CheckedPlan] = []

    def serve(checked: CheckedPlan, options: object, **_: object) -> int:
        plans.append(checked)
        return 0

    monkeypatch.setattr("sm120.deploy.session.serve", serve)
    return plans


def managed(home: Path, repo: str) -> Path:
    return home / "models" / repo.replace("/", "--")


def test_dry_run_shows_the_folder_launch_serves(cli: CliRunner, isolated_home: Path) -> None:
    code, out, _ = invoke(cli, "launch", "glm47", "--dry-run", "--json", *HW)
    doc = json.loads(out)
    folder = str(managed(isolated_home, GLM47))
    assert code == 0
    assert doc["model"]["dir"] == folder
    argv = doc["argv"]
    assert argv[argv.index("--model") + 1] == folder
    assert "--revision" not in argv


def test_incomplete_weights_are_refused_when_nobody_can_be_asked(
    cli: CliRunner, hub: FakeHub, isolated_home: Path, served: list[CheckedPlan]
) -> None:
    code, _, err = invoke(cli, "launch", "glm47", *HW)
    folder = managed(isolated_home, GLM47)
    assert code == 2
    assert err.splitlines() == [
        "not asking to download: stdin is not a terminal",
        f"Error: the weights in {folder} are incomplete: {folder} does not exist "
        "(hint: run 'sm120 download glm47', or launch again with --yes)",
    ]
    assert hub.seen == [] and served == []


def test_missing_and_truncated_shards_are_listed(
    cli: CliRunner, hub: FakeHub, tmp_path: Path, served: list[CheckedPlan]
) -> None:
    folder = write_files(tmp_path / "ckpt", checkpoint())
    (folder / "model-00001-of-00002.safetensors").unlink()
    shard2 = folder / "model-00002-of-00002.safetensors"
    size = shard2.stat().st_size
    shard2.write_bytes(shard2.read_bytes()[:-100])
    code, _, err = invoke(cli, "launch", "glm47", *HW, "--model-dir", str(folder))
    assert code == 2
    assert err.splitlines()[-1] == (
        f"Error: the weights in {folder} are incomplete: "
        "model-00001-of-00002.safetensors: missing; "
        f"model-00002-of-00002.safetensors: truncated ({size - 100:,} of {size:,} bytes) "
        f"(hint: run 'sm120 download glm47 --dir {folder}', or launch again with --yes)"
    )
    assert served == []


def test_yes_downloads_then_serves_with_values_read_from_the_checkpoint(
    cli: CliRunner, hub: FakeHub, isolated_home: Path, served: list[CheckedPlan]
) -> None:
    hub.add_repo(GLM52, checkpoint(config=GLM52_CONFIG))
    code, _, err = invoke(cli, "launch", "glm52", *HW, "--yes")
    folder = managed(isolated_home, GLM52)
    assert code == 0, err
    assert verify_dir(folder).ok
    [checked] = served
    plan = checked.plan
    assert plan.model_dir == str(folder)
    # Resolved again after the download: the F09 pattern comes from the fetched config.json.
    assert plan.pending == ()
    assert plan.derived["index_topk_pattern"]["pattern"] == "FSFS"
    assert plan.arg("hf-overrides")["index_topk_pattern"] == "FSFS"
    assert "pins no revision of 0xSero/GLM-5.2-NVFP4-REAP-469B" in err

    # Complete now: the next launch neither asks nor talks to the Hub.
    hub.seen.clear()
    code, _, err = invoke(cli, "launch", "glm52", *HW)
    assert code == 0, err
    assert hub.seen == [] and len(served) == 2


def test_a_folder_at_another_commit_is_not_served(
    cli: CliRunner, hub: FakeHub, tmp_path: Path, served: list[CheckedPlan]
) -> None:
    folder = write_files(tmp_path / "ckpt", checkpoint())
    from sm120.weights.download_record import Manifest

    write_manifest(folder, Manifest(repo=GLM47, revision=None, commit="f" * 40))
    code, _, err = invoke(cli, "launch", "glm47", *HW, "--model-dir", str(folder))
    assert code == 2
    assert err.splitlines()[-1].startswith(
        f"Error: the weights in {folder} are incomplete: the folder holds "
        f"{GLM47}@ffffffffff; the recipe pins 531df318db (hint:"
    )


def test_offline_environment_refuses_instead_of_downloading(
    cli: CliRunner, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, isolated_home: Path
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = invoke(cli, "launch", "glm47", *HW, "--yes")
    assert code == 2
    assert err.splitlines()[-1].endswith(
        "(hint: HF_HUB_OFFLINE is set; run 'sm120 download glm47', or launch again with --yes "
        "while online)"
    )
    assert hub.seen == []


def test_the_question_and_the_answers(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    folder = tmp_path / "ckpt"
    plan = resolve(PlanRequest(recipe="glm47", model_dir=str(folder)))
    asked: list[str] = []

    def no(question: str) -> bool:
        asked.append(question)
        return False

    with pytest.raises(WeightsIncomplete) as refused:
        ensure_weights(plan, ask=no, events=QuietEvents())
    assert asked == [
        f"the weights in {folder} are incomplete: {folder} does not exist. "
        f"Download {GLM47}@531df318db (about 101 GB) into {folder} now?"
    ]
    assert refused.value.one_line() == (
        f"the weights in {folder} are incomplete: {folder} does not exist "
        f"(hint: run 'sm120 download glm47 --dir {folder}', or launch again with --yes)"
    )
    assert hub.seen == [] and not folder.exists()

    assert ensure_weights(plan, ask=lambda question: True, events=QuietEvents()) == folder
    manifest = read_manifest(folder)
    assert manifest is not None and manifest.commit == GLM47_COMMIT


def test_the_generated_tiny_model_is_left_to_launch(tmp_path: Path) -> None:
    plan = resolve(PlanRequest(recipe="tiny", model_dir=str(tmp_path / "not-built-yet")))
    assert with_managed_dir(PlanRequest(recipe="tiny"), plan) is None
    assert ensure_weights(plan, ask=None, events=QuietEvents()) is None
    assert not (tmp_path / "not-built-yet").exists()


def test_tiny_dry_run_is_unchanged(cli: CliRunner, isolated_home: Path) -> None:
    code, out, _ = invoke(cli, "launch", "tiny", "--dry-run", "--json")
    assert code == 0
    assert json.loads(out)["model"]["dir"] == str(isolated_home / "models" / "tiny")
