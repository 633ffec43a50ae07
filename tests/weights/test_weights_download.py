"""`sm120 download` against a local server that speaks the Hub's download API (tests/fakes/hub.py)
through the real huggingface_hub client: file selection, pinned and unpinned revisions,
resuming after a cut connection, a failed run and Ctrl-C, the token, offline mode."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.weights.download import git_blob_id
from sm120.weights.download_record import download_lock, partial_dir, read_manifest
from sm120.weights.selection import needed_files
from sm120.weights.verify import verify_dir
from tests.fakes.checkpoints import UNWANTED, checkpoint, write_files
from tests.fakes.hub import GLM47, GLM47_COMMIT, GLM52, TOKEN, FakeHub, Seen
from tests.helpers import REPO, invoke

CHUNK = 10 * 1024 * 1024  # huggingface_hub hands bytes over in 10 MiB chunks
BIG = "model-00001-of-00002.safetensors"


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub(token=TOKEN) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored login
        for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(name, raising=False)
        yield server


def gets_of(hub: FakeHub, content: bytes) -> list[Seen]:
    """GETs of one LFS file's bytes (the CDN URL names its sha256)."""
    return hub.requests("GET", contains=f"/cdn/{hashlib.sha256(content).hexdigest()}")


def files_in(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file() and ".sm120" not in path.relative_to(folder).parts
    }


def test_only_the_files_the_engine_needs_are_fetched(
    cli: CliRunner, hub: FakeHub, tmp_path: Path
) -> None:
    wanted = checkpoint()
    hub.add_repo(GLM47, {**wanted, **UNWANTED}, commit=GLM47_COMMIT)
    dest = tmp_path / "glm47"
    code, out, err = invoke(cli, "download", "glm47", "--dir", str(dest))
    assert code == 0, err
    assert out == f"{dest}\n"
    assert files_in(dest) == wanted
    for unwanted in UNWANTED:
        assert hub.requests(contains=unwanted) == []
    # A pinned commit needs no revision lookup; the tree is listed at that commit.
    assert hub.requests(contains="/revision/") == []
    assert [r.path for r in hub.requests(contains="/tree/")] == [
        f"/api/models/{GLM47}/tree/{GLM47_COMMIT}"
    ]
    assert verify_dir(dest).ok
    manifest = read_manifest(dest)
    assert manifest is not None
    assert (manifest.repo, manifest.commit, manifest.recipe) == (GLM47, GLM47_COMMIT, "glm47")
    assert sorted(manifest.done) == sorted(wanted)
    assert err.splitlines()[-1] == f"fetched {len(wanted)} files (0.01 MB), 0 already complete"


def test_default_folder_is_sm120s_own(cli: CliRunner, hub: FakeHub, isolated_home: Path) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    code, out, _ = invoke(cli, "download", "glm47")
    dest = isolated_home / "models" / "Salyut1--GLM-4.7-NVFP4"
    assert (code, out) == (0, f"{dest}\n")
    assert verify_dir(dest).ok


def test_model_dir_from_the_environment_is_the_default(
    cli: CliRunner, hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    monkeypatch.setenv("SM120_MODEL_DIR", str(tmp_path / "from-env"))
    code, out, _ = invoke(cli, "download", "glm47")
    assert (code, out) == (0, f"{tmp_path / 'from-env'}\n")


def test_unpinned_revision_is_resolved_and_said(
    cli: CliRunner, hub: FakeHub, tmp_path: Path
) -> None:
    commit = hub.add_repo(GLM52, checkpoint())
    code, _, err = invoke(cli, "download", "glm52", "--dir", str(tmp_path / "g"))
    assert code == 0, err
    assert [r.path for r in hub.requests(contains="/revision/")] == [
        f"/api/models/{GLM52}/revision/main"
    ]
    assert err.splitlines()[0] == (
        f"note: recipe 'glm52' pins no revision: fetching main as of commit {commit[:10]}"
    )
    manifest = read_manifest(tmp_path / "g")
    assert manifest is not None and (manifest.revision, manifest.commit) == (None, commit)


def test_second_run_fetches_nothing(cli: CliRunner, hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    dest = str(tmp_path / "d")
    assert invoke(cli, "download", "glm47", "--dir", dest)[0] == 0
    hub.seen.clear()
    code, _, err = invoke(cli, "download", "glm47", "--dir", dest)
    assert code == 0
    assert hub.requests(contains="/resolve/") == [] and hub.requests(contains="/cdn/") == []
    assert err.splitlines()[-1] == "fetched 0 files (0.00 MB), 8 already complete"


def big_checkpoint() -> dict[str, bytes]:
    # More than one 10 MiB chunk, so an interrupted transfer leaves bytes behind.
    return checkpoint((12 * 1024 * 1024, 2048))


def test_failed_run_keeps_its_bytes_and_the_next_run_asks_for_the_rest(
    cli: CliRunner, hub: FakeHub, tmp_path: Path
) -> None:
    files = big_checkpoint()
    hub.add_repo(GLM47, files, commit=GLM47_COMMIT)
    # The connection drops mid-file; huggingface_hub's own retry then gets a 503.
    hub.fault(BIG, "cut:11000000", "status:503")
    dest = tmp_path / "d"
    code, out, err = invoke(cli, "download", "glm47", "--dir", str(dest))
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (
        f"Error: the Hub answered 503 while downloading {BIG} "
        "(hint: run the download again: it resumes where it stopped)"
    )
    [part] = partial_dir(dest).iterdir()
    assert part.stat().st_size == CHUNK
    assert not (dest / BIG).exists()

    hub.seen.clear()
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(dest))
    assert code == 0, err
    [get] = gets_of(hub, files[BIG])
    assert get.header("range") == f"bytes={CHUNK}-"
    assert (dest / BIG).read_bytes() == files[BIG]
    assert list(partial_dir(dest).iterdir()) == []
    assert "1 resumed" in err.splitlines()[-1]
    assert verify_dir(dest).ok


def test_a_cut_connection_is_resumed_within_the_run(
    cli: CliRunner, hub: FakeHub, tmp_path: Path
) -> None:
    files = big_checkpoint()
    hub.add_repo(GLM47, files, commit=GLM47_COMMIT)
    hub.fault(BIG, "cut:11000000")
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(tmp_path / "d"))
    assert code == 0, err
    gets = gets_of(hub, files[BIG])
    assert [g.header("range") for g in gets] == [None, f"bytes={CHUNK}-"]
    # huggingface_hub's warning about it became a progress note.
    assert "peer closed connection" in err and "Trying to resume download" in err
    assert (tmp_path / "d" / BIG).read_bytes() == files[BIG]


def test_ctrl_c_keeps_the_bytes_and_the_next_run_resumes(
    cli: CliRunner, hub: FakeHub, tmp_path: Path, isolated_home: Path
) -> None:
    files = big_checkpoint()
    hub.add_repo(GLM47, files, commit=GLM47_COMMIT)
    hub.fault(BIG, "stall:11000000")  # sends 11 MB, then hangs like a dead link
    dest = tmp_path / "d"
    # huggingface_hub gives up on a silent read after 10 s and resumes, which would end the
    # stall and finish the download before the Ctrl-C on a loaded machine: hold it longer.
    env = {
        **os.environ,
        "SM120_HOME": str(isolated_home),
        "PYTHONPATH": str(REPO),
        "HF_HUB_DOWNLOAD_TIMEOUT": "120",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "sm120", "download", "glm47", "--dir", str(dest)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        fetched = False
        while not fetched and time.monotonic() < deadline:
            parts = list(partial_dir(dest).glob("*.part")) if partial_dir(dest).is_dir() else []
            fetched = bool(parts) and parts[0].stat().st_size >= CHUNK
            time.sleep(0.1)
        assert fetched, "the download never held a first chunk in its .part file"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130
    assert err.splitlines()[-1] == (
        f"interrupted: the bytes fetched so far are kept in {partial_dir(dest)}; "
        "run the same command again to resume"
    )
    hub.seen.clear()
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(dest))
    assert code == 0, err
    [get] = gets_of(hub, files[BIG])
    assert get.header("range") == f"bytes={CHUNK}-"
    assert (dest / BIG).read_bytes() == files[BIG]


def test_a_corrupt_transfer_is_caught_and_not_kept(
    cli: CliRunner, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    hub.fault(BIG, "corrupt")  # the right length, the wrong bytes: only the hash can tell
    dest = tmp_path / "d"
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(dest))
    assert code == 2
    assert err.splitlines()[-1] == (
        f"Error: {BIG} does not match the Hub's checksum (the partial file was removed) "
        "(hint: run the download again: it resumes where it stopped)"
    )
    assert list(partial_dir(dest).iterdir()) == [] and not (dest / BIG).exists()


def test_files_already_in_the_folder_are_checked_not_fetched(
    cli: CliRunner, hub: FakeHub, tmp_path: Path
) -> None:
    files = checkpoint()
    hub.add_repo(GLM47, files, commit=GLM47_COMMIT)
    dest = write_files(tmp_path / "d", files)  # e.g. copied, or fetched by another tool
    (dest / "tokenizer.json").write_bytes(b"x" * len(files["tokenizer.json"]))  # same size, wrong
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(dest))
    assert code == 0, err
    fetched = [r.path.rsplit("/", 1)[-1] for r in hub.requests("GET", contains="/resolve/")]
    assert fetched == ["tokenizer.json"]
    assert hub.requests("GET", contains="/cdn/") == []
    assert files_in(dest) == files
    assert err.splitlines()[-1] == "fetched 1 files (0.00 MB), 7 already complete"


def test_token_goes_to_the_hub_only_and_is_never_shown(
    cli: CliRunner,
    hub: FakeHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT, private=True)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)
    code, out, err = invoke(cli, "download", "glm47", "--dir", str(tmp_path / "d"))
    assert code == 0, err
    to_hub = hub.requests(contains="/api/") + hub.requests(contains="/resolve/")
    assert to_hub and all(r.header("authorization") == f"Bearer {TOKEN}" for r in to_hub)
    to_cdn = hub.requests(contains="/cdn/")
    assert to_cdn and all(r.header("authorization") is None for r in to_cdn)
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "d").rglob("*.json"))
    for text in (out, err, caplog.text, written):
        assert TOKEN not in text


def test_token_stays_hidden_when_debug_logging_is_on(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT, private=True)
    env = {
        **os.environ,
        "HF_TOKEN": TOKEN,
        "HF_HUB_VERBOSITY": "debug",
        "SM120_DEBUG": "1",
        "PYTHONPATH": str(REPO),
    }
    result = subprocess.run(
        [sys.executable, "-m", "sm120", "download", "glm47", "--dir", str(tmp_path / "d")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Request " in result.stderr  # huggingface_hub's debug log did run
    assert TOKEN not in result.stdout + result.stderr


def test_private_repo_without_a_token(cli: CliRunner, hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT, private=True)
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(tmp_path / "d"))
    assert code == 2
    assert err == (
        f"Error: {GLM47} was not found on the Hub, or is private to this token (hint: check the "
        "recipe's model.repo; for a private repo set HF_TOKEN to a token that can read it "
        "(it is never printed))\n"
    )


def test_wrong_token_is_refused_without_being_shown(
    cli: CliRunner, hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT, private=True)
    monkeypatch.setenv("HF_TOKEN", "hf_wrongTOKENvalue42")
    code, out, err = invoke(cli, "download", "glm47", "--dir", str(tmp_path / "d"))
    assert code == 2 and err.startswith(f"Error: {GLM47} was not found on the Hub")
    assert "hf_wrongTOKENvalue42" not in out + err


def test_pinned_revision_missing_on_the_hub(cli: CliRunner, hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(GLM47, checkpoint())  # another commit
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(tmp_path / "d"))
    assert code == 2
    assert err == (
        f"Error: {GLM47} has no revision '{GLM47_COMMIT}' "
        "(hint: check the recipe's model.revision)\n"
    )


def test_unreachable_hub(cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import free_port

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    # huggingface_hub retries five times with backoff (23 s): keep its retries, skip the waits.
    monkeypatch.setattr("huggingface_hub.utils._http.time.sleep", lambda seconds: None)
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(tmp_path / "d"))
    assert code == 2
    last = err.splitlines()[-1] + "\n"
    assert last.startswith(f"Error: cannot reach the Hub while listing the files of {GLM47}: ")
    assert last.endswith(
        "(hint: check the network (or HF_ENDPOINT), then run again; the bytes fetched so far "
        "are kept)\n"
    )


def test_offline_uses_what_is_there(
    cli: CliRunner, hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    dest = tmp_path / "d"
    assert invoke(cli, "download", "glm47", "--dir", str(dest))[0] == 0
    hub.seen.clear()
    assert invoke(cli, "download", "glm47", "--dir", str(dest), "--offline") == (
        0,
        f"{dest}\n",
        "",
    )
    (dest / "tokenizer.json").unlink()
    code, out, err = invoke(cli, "download", "glm47", "--dir", str(dest), "--offline")
    assert (code, out) == (2, "")
    assert err == (
        f"Error: offline, and {dest} is incomplete: tokenizer.json: missing or incomplete "
        f"(downloaded from {GLM47}) (hint: run 'sm120 download glm47 --dir {dest}' while online)\n"
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # huggingface_hub's switch means the same
    code, _, err2 = invoke(cli, "download", "glm47", "--dir", str(dest))
    assert (code, err2) == (2, err)
    assert hub.seen == []


def test_offline_with_nothing_there(cli: CliRunner, hub: FakeHub, isolated_home: Path) -> None:
    code, _, err = invoke(cli, "download", "glm47", "--offline")
    dest = isolated_home / "models" / "Salyut1--GLM-4.7-NVFP4"
    assert code == 2
    assert err == (
        f"Error: offline, and {dest} is incomplete: {dest} does not exist "
        "(hint: run 'sm120 download glm47' while online)\n"
    )


def test_dry_run_lists_and_writes_nothing(cli: CliRunner, hub: FakeHub, tmp_path: Path) -> None:
    files = checkpoint()
    hub.add_repo(GLM47, {**files, **UNWANTED}, commit=GLM47_COMMIT)
    dest = tmp_path / "d"
    code, out, _ = invoke(cli, "download", "glm47", "--dir", str(dest), "--dry-run")
    assert code == 0
    lines = out.splitlines()
    assert sorted(line.split()[-1] for line in lines[:-1]) == sorted(files)
    assert all(line.startswith("fetch ") for line in lines[:-1])
    assert lines[-1] == (
        f"would fetch 0.01 MB of {GLM47}@{GLM47_COMMIT[:10]} into {dest} "
        "(8 of 8 files to fetch or check)"
    )
    assert not dest.exists()
    assert hub.requests(contains="/resolve/") == []


def test_folder_of_another_repo_is_refused(cli: CliRunner, hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    hub.add_repo(GLM52, checkpoint())
    dest = str(tmp_path / "d")
    assert invoke(cli, "download", "glm52", "--dir", dest)[0] == 0
    code, _, err = invoke(cli, "download", "glm47", "--dir", dest)
    assert code == 2
    assert (
        err
        == f"Error: {dest} holds a download of {GLM52}, not {GLM47} (hint: pick another --dir)\n"
    )


def test_one_download_per_folder(cli: CliRunner, hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    dest = tmp_path / "d"
    with download_lock(dest):
        code, _, err = invoke(cli, "download", "glm47", "--dir", str(dest))
    assert code == 2
    assert err == (
        f"Error: another download is writing into {dest} "
        "(hint: wait for it to finish (or stop it), then run again)\n"
    )


def test_not_enough_disk_space(
    cli: CliRunner, hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1000))
    dest = tmp_path / "d"
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(dest))
    assert code == 2
    needed = sum(len(v) for v in checkpoint().values()) / 1e6
    assert err == (
        f"Error: {dest} has 0.00 MB free; the download needs {needed:.2f} MB more "
        "(hint: free some space, or pick a folder on a larger disk with --dir)\n"
    )


def test_generated_model_has_nothing_to_download(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "download", "tiny")
    assert code == 2
    assert err == (
        "Error: recipe 'tiny' generates its model locally; there is nothing to download "
        "(hint: 'sm120 launch tiny' builds it)\n"
    )


def test_which_files_the_engine_needs() -> None:
    repo = [
        ".gitattributes",
        "README.md",
        "config.json",
        "generation_config.json",
        "hf_quant_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00041.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "chat_template.jinja",
        "merges.txt",
        "configuration_deepseek.py",
        "pytorch_model-00001-of-00002.bin",
        "consolidated.safetensors",
        "original/consolidated.00.pth",
        "original/params.json",
        "inference/config_671B.json",
        "model-Q4_K_M.gguf",
        "figures/benchmark.png",
        "onnx/model.onnx",
    ]
    assert needed_files(repo) == [
        "config.json",
        "generation_config.json",
        "hf_quant_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00041.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "chat_template.jinja",
        "merges.txt",
        "configuration_deepseek.py",
    ]
    # Without the Hugging Face layout, the consolidated file is the checkpoint.
    assert needed_files(["params.json", "consolidated.safetensors"]) == [
        "params.json",
        "consolidated.safetensors",
    ]


def test_git_blob_id_is_gits(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"some content\n\0with a nul")
    git = subprocess.run(
        ["git", "hash-object", str(path)], capture_output=True, text=True, check=True
    )
    assert git_blob_id(path) == git.stdout.strip()


def test_manifest_survives_as_json(cli: CliRunner, hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    dest = tmp_path / "d"
    assert invoke(cli, "download", "glm47", "--dir", str(dest))[0] == 0
    raw = json.loads((dest / ".sm120" / "download.json").read_text())
    assert raw["repo"] == GLM47 and raw["commit"] == GLM47_COMMIT
    assert {f["path"] for f in raw["files"]} == set(checkpoint())


def test_every_failed_file_is_counted_and_the_rest_complete(
    cli: CliRunner, hub: FakeHub, tmp_path: Path
) -> None:
    files = checkpoint()
    hub.add_repo(GLM47, files, commit=GLM47_COMMIT)
    hub.fault("model-00001-of-00002.safetensors", "status:500")
    hub.fault("model-00002-of-00002.safetensors", "status:500")
    dest = tmp_path / "d"
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(dest))
    assert code == 2
    assert err.splitlines()[-1].startswith(
        "Error: the Hub answered 500 while downloading model-0000"
    )
    assert "(and 1 more files) (hint: run the download again" in err
    manifest = read_manifest(dest)
    assert manifest is not None and len(manifest.done) == len(files) - 2


def test_partial_files_of_other_content_are_dropped(
    cli: CliRunner, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(GLM47, checkpoint(), commit=GLM47_COMMIT)
    dest = tmp_path / "d"
    stale = partial_dir(dest) / f"{BIG}.{'0' * 40}.part"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"bytes of an older revision")
    assert invoke(cli, "download", "glm47", "--dir", str(dest))[0] == 0
    assert not stale.exists()


def test_a_listed_path_outside_the_repo_is_refused(
    cli: CliRunner, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(GLM47, {**checkpoint(), "../escape.json": b"{}"}, commit=GLM47_COMMIT)
    code, _, err = invoke(cli, "download", "glm47", "--dir", str(tmp_path / "d"))
    assert code == 2
    assert err == (
        "Error: the Hub listed a path outside the repo: ../escape.json (hint: check HF_ENDPOINT)\n"
    )
    assert not (tmp_path / "escape.json").exists()


def test_progress_on_a_terminal() -> None:
    import io

    from rich.console import Console

    from sm120.cli.weights import DownloadProgress

    screen = io.StringIO()
    with DownloadProgress() as progress:
        progress.console = Console(file=screen, force_terminal=True, width=100)
        progress.live = True
        progress.begin(2, 1, 3000, 1000)
        progress.file_started("model.safetensors", 2000, 500)
        progress.advance("model.safetensors", 1500)
        progress.file_done("model.safetensors")
        assert progress.tasks == {}
        assert progress.progress.tasks[0].completed == 2500
    assert "2/2 files" in screen.getvalue()
