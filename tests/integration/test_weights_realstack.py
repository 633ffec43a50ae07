"""Weights against the real stack: `verify` on the model the engine's own torch wrote, and
`launch --yes` fetching a missing checkpoint from a Hub stand-in (through huggingface_hub)
and the real vLLM (CPU build) serving what was fetched."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sm120.recipe.loader import recipes_dir
from sm120.weights.verify import verify_dir
from tests.fakes.checkpoints import UNWANTED
from tests.fakes.hub import FakeHub
from tests.helpers import free_port
from tests.integration.realstack import cli_env, engine_processes, state_of

pytestmark = pytest.mark.integration

REPO_ID = "sm120-test/tiny-hub"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, engine_python: Path) -> Path:
    from sm120.engine.tiny_model import ensure_tiny_model

    dest = tmp_path_factory.mktemp("weights-models") / "tiny"
    return ensure_tiny_model(engine_python, dest, lambda _: None)


def test_verify_reads_what_the_engine_wrote(tiny_model: Path, tmp_path: Path) -> None:
    report = verify_dir(tiny_model)
    assert report.ok, report.problems
    assert report.layout == "single" and report.total_bytes > 1_000_000
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in tiny_model.iterdir():
        data = path.read_bytes()
        (copy / path.name).write_bytes(data[:-4096] if path.suffix == ".safetensors" else data)
    [shard] = verify_dir(copy).bad_shards
    assert (shard.file, shard.status) == ("model.safetensors", "truncated")


def hub_recipe(folder: Path, commit: str) -> Path:
    """The tiny recipe, but fetched from a repo instead of generated."""
    data = yaml.safe_load((recipes_dir() / "tiny.yaml").read_text())
    data["name"] = "tinyhub"
    data["model"].update(repo=REPO_ID, revision=commit)
    data["model"].pop("generated")
    folder.mkdir()
    (folder / "tinyhub.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder


def test_launch_fetches_missing_weights_and_the_engine_serves_them(
    tiny_model: Path, tmp_path: Path
) -> None:
    files = {p.name: p.read_bytes() for p in tiny_model.iterdir() if p.is_file()}
    home, port = tmp_path / "home", free_port()
    with FakeHub() as hub:
        commit = hub.add_repo(REPO_ID, {**files, **UNWANTED})
        env = {
            **cli_env(home),
            "SM120_RECIPES_DIR": str(hub_recipe(tmp_path / "recipes", commit)),
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(tmp_path / "hf-home"),
        }
        argv = [sys.executable, "-m", "sm120", "launch", "tinyhub", "--port", str(port), "--yes"]
        try:
            launched = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=900, check=False
            )
            assert launched.returncode == 0, launched.stderr[-3000:]
            assert "READY tinyhub answered:" in launched.stdout
            folder = home / "models" / "sm120-test--tiny-hub"
            state = state_of(home, "tinyhub")
            assert state is not None and state["model_dir"] == str(folder)
            fetched = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
            assert fetched == files  # byte for byte, and none of the repo's other files
            assert hub.requests(contains="pytorch_model.bin") == []
        finally:
            subprocess.run(
                [sys.executable, "-m", "sm120", "stop", "--name", "tinyhub"],
                env=env,
                capture_output=True,
                timeout=120,
                check=False,
            )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and engine_processes(port):
        time.sleep(0.5)
    assert engine_processes(port) == []
