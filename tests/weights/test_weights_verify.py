"""`sm120 verify DIR` on good, truncated, missing-shard and damaged checkpoints made of real
safetensors files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.weights.verify import read_header, verify_dir
from tests.fakes.checkpoints import (
    INDEX,
    checkpoint,
    library_safetensors_bytes,
    safetensors_bytes,
    shard_tensors,
    write_files,
)
from tests.helpers import invoke

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return write_files(tmp_path / "ckpt", checkpoint())


def test_hand_written_files_are_what_the_safetensors_library_reads() -> None:
    from safetensors import deserialize

    tensors = shard_tensors(1, 100)
    ours = safetensors_bytes(tensors)
    theirs = library_safetensors_bytes(tensors)
    assert {name: bytes(t["data"]) for name, t in deserialize(ours)} == {
        name: data for name, (_, _, data) in tensors.items()
    }
    assert dict(deserialize(theirs)) == dict(deserialize(ours))


def test_header_size_matches_the_file_the_library_writes(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(library_safetensors_bytes(shard_tensors(1, 1000)))
    header = read_header(path)
    assert header.expected_size == path.stat().st_size
    assert header.tensors == {"model.layers.1.mlp.weight", "model.layers.1.norm.weight"}
    assert header.data_bytes == 1000 + 16


def test_good_checkpoint_passes(cli: CliRunner, good: Path) -> None:
    code, out, err = invoke(cli, "verify", str(good))
    total = (good / SHARD1).stat().st_size + (good / SHARD2).stat().st_size
    assert (code, err) == (0, "")
    assert out == f"ok  {good}: config.json and 2 shards, {total / 1e6:.2f} MB\n"


def test_shards_written_by_the_library_pass(cli: CliRunner, tmp_path: Path) -> None:
    folder = write_files(tmp_path / "lib", checkpoint(writer=library_safetensors_bytes))
    assert verify_dir(folder).ok


def test_truncated_shard_is_named(cli: CliRunner, good: Path) -> None:
    full = (good / SHARD2).read_bytes()
    (good / SHARD2).write_bytes(full[:-100])
    code, out, err = invoke(cli, "verify", str(good))
    assert code == 1
    expected = f"{SHARD2}: truncated ({len(full) - 100:,} of {len(full):,} bytes)"
    assert out == f"FAIL  {expected}\n"
    assert err == (
        f"Error: {good} is not a complete checkpoint: {expected} "
        f"(hint: fetch what is missing with 'sm120 download RECIPE --dir {good}')\n"
    )


def test_missing_shard_is_named(cli: CliRunner, good: Path) -> None:
    (good / SHARD1).unlink()
    code, out, err = invoke(cli, "verify", str(good))
    assert code == 1
    assert out == f"FAIL  {SHARD1}: missing\n"
    assert err.startswith(f"Error: {good} is not a complete checkpoint: {SHARD1}: missing (hint:")


def test_every_problem_is_listed_and_the_error_names_the_first_ones(
    cli: CliRunner, good: Path
) -> None:
    (good / "config.json").unlink()
    (good / SHARD1).unlink()
    (good / SHARD2).write_bytes((good / SHARD2).read_bytes()[:5])
    code, out, err = invoke(cli, "verify", str(good))
    assert code == 1
    assert out.splitlines() == [
        "FAIL  config.json: missing",
        f"FAIL  {SHARD1}: missing",
        f"FAIL  {SHARD2}: truncated (5 bytes, less than the 8-byte header length)",
    ]
    assert "config.json: missing; " + SHARD1 + ": missing; " + SHARD2 in err


def test_a_shard_cut_inside_its_header_is_truncated(good: Path) -> None:
    (good / SHARD1).write_bytes((good / SHARD1).read_bytes()[:40])
    [bad] = verify_dir(good).bad_shards
    assert bad.status == "truncated"
    assert bad.detail is not None and bad.detail.startswith("40 bytes, ends inside its")


def test_trailing_bytes_fail_like_the_loader_does(good: Path) -> None:
    from safetensors import SafetensorError, deserialize

    data = (good / SHARD1).read_bytes() + b"\0" * 8
    (good / SHARD1).write_bytes(data)
    with pytest.raises(SafetensorError):
        deserialize(data)
    assert verify_dir(good).problems == (f"{SHARD1}: 8 bytes longer than its header says",)


def test_garbage_is_unreadable(good: Path) -> None:
    (good / SHARD1).write_bytes(b"\xff" * 64)
    assert verify_dir(good).problems == (
        f"{SHARD1}: unreadable (header length 18446744073709551615 is not plausible)",
    )
    (good / SHARD1).write_bytes((16).to_bytes(8, "little") + b"not json at all!")
    assert verify_dir(good).problems == (
        f"{SHARD1}: unreadable (header is not JSON (JSONDecodeError))",
    )


def test_bad_offsets_are_unreadable(good: Path) -> None:
    header = json.dumps({"w": {"dtype": "U8", "shape": [4], "data_offsets": [4, 0]}}).encode()
    (good / SHARD1).write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    assert verify_dir(good).problems == (
        f"{SHARD1}: unreadable (tensor 'w' has no valid data_offsets)",
    )


def test_tensors_missing_from_their_shard(good: Path) -> None:
    index = json.loads((good / INDEX).read_text())
    index["weight_map"]["lm_head.weight"] = SHARD2
    (good / INDEX).write_text(json.dumps(index))
    assert verify_dir(good).problems == (
        f"1 tensor(s) the index lists are not in their shard (first: lm_head.weight in {SHARD2})",
    )


def test_index_naming_files_outside_the_folder(good: Path) -> None:
    index = json.loads((good / INDEX).read_text())
    index["weight_map"]["x"] = "../elsewhere.safetensors"
    (good / INDEX).write_text(json.dumps(index))
    assert verify_dir(good).problems == (
        f"{INDEX}: names files outside the folder (../elsewhere.safetensors)",
    )


def test_unreadable_index(good: Path) -> None:
    (good / INDEX).write_text("{")
    assert verify_dir(good).problems == (f"{INDEX}: not readable JSON (JSONDecodeError)",)
    (good / INDEX).write_text('{"metadata": {}}')
    assert verify_dir(good).problems == (f"{INDEX}: has no weight_map",)


def test_single_file_without_index(cli: CliRunner, tmp_path: Path) -> None:
    folder = write_files(tmp_path / "single", {"config.json": b"{}"})
    (folder / "model.safetensors").write_bytes(safetensors_bytes(shard_tensors(1, 64)))
    code, out, _ = invoke(cli, "verify", str(folder))
    assert code == 0 and out.startswith(f"ok  {folder}: config.json and 1 shard, ")
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:-1])
    code, out, _ = invoke(cli, "verify", str(folder))
    assert code == 1 and out.startswith("FAIL  model.safetensors: truncated (")


def test_folder_without_weights(cli: CliRunner, tmp_path: Path) -> None:
    folder = write_files(tmp_path / "empty", {"config.json": b"{}"})
    code, out, _ = invoke(cli, "verify", str(folder))
    assert code == 1
    assert out == f"FAIL  no {INDEX} and no model.safetensors\n"


def test_json_report(cli: CliRunner, good: Path) -> None:
    size = (good / SHARD2).stat().st_size
    (good / SHARD2).write_bytes((good / SHARD2).read_bytes()[:-1])
    code, out, err = invoke(cli, "verify", str(good), "--json")
    doc = json.loads(out)
    assert code == 1 and err.startswith("Error: ")
    assert doc["ok"] is False and doc["config"] is True and doc["layout"] == "index"
    assert [(s["file"], s["status"]) for s in doc["shards"]] == [
        (SHARD1, "ok"),
        (SHARD2, "truncated"),
    ]
    assert doc["shards"][1]["size"] == size - 1 and doc["shards"][1]["expected_size"] == size
    assert doc["problems"] == [f"{SHARD2}: truncated ({size - 1:,} of {size:,} bytes)"]


def test_not_a_folder(cli: CliRunner, tmp_path: Path) -> None:
    code, out, err = invoke(cli, "verify", str(tmp_path / "nope"))
    assert (code, out) == (2, "")
    assert err == (
        f"Error: {tmp_path / 'nope'} is not a folder "
        "(hint: pass the checkpoint folder (the one holding config.json))\n"
    )
