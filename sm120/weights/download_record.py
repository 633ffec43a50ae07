"""What `sm120 download` records inside a checkpoint folder, under DIR/.sm120/:

  download.json   the repo, the commit, every file the engine needs there, and which of
                  them are complete (by git object id, so an unchanged file survives a
                  revision bump)
  partial/        bytes of files still in flight, kept across runs so the next run resumes
  lock            held while a download writes into the folder

The engine never looks inside .sm120/; vLLM only reads the files named in the index.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error
from sm120.engine.state import write_private_atomically

STATE_DIR = ".sm120"
MANIFEST_FILE = "download.json"
PARTIAL_DIR = "partial"
LOCK_FILE = "lock"


@dataclass(frozen=True)
class RemoteFile:
    """One file of the repo at the pinned commit, as the Hub's tree listing describes it."""

    path: str
    size: int
    oid: str  # git blob id: changes whenever the content does
    sha256: str | None = None  # content hash the Hub keeps for LFS files (all weight shards)


@dataclass
class Manifest:
    repo: str
    revision: str | None  # as the recipe pins it; None when it pins nothing
    commit: str  # what the revision resolved to when the listing was taken
    recipe: str | None = None
    files: dict[str, RemoteFile] = field(default_factory=dict)
    done: dict[str, str] = field(default_factory=dict)  # path -> oid of the finished copy

    def to_json(self) -> str:
        data: dict[str, Any] = asdict(self)
        data["files"] = [asdict(remote) for remote in self.files.values()]
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        files = [RemoteFile(**entry) for entry in data.get("files", [])]
        return cls(
            repo=str(data["repo"]),
            revision=data.get("revision"),
            commit=str(data["commit"]),
            recipe=data.get("recipe"),
            files={remote.path: remote for remote in files},
            done={str(k): str(v) for k, v in dict(data.get("done", {})).items()},
        )

    def is_done(self, remote: RemoteFile, folder: Path) -> bool:
        target = folder / remote.path
        return (
            self.done.get(remote.path) == remote.oid
            and target.is_file()
            and target.stat().st_size == remote.size
        )


def state_dir(folder: Path) -> Path:
    return folder / STATE_DIR


def partial_dir(folder: Path) -> Path:
    return state_dir(folder) / PARTIAL_DIR


def read_manifest(folder: Path) -> Manifest | None:
    path = state_dir(folder) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        return Manifest.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        # A damaged record only costs a re-check of the files; never block on it.
        return None


def write_manifest(folder: Path, manifest: Manifest) -> None:
    state_dir(folder).mkdir(parents=True, exist_ok=True)
    write_private_atomically(state_dir(folder) / MANIFEST_FILE, manifest.to_json())


@contextlib.contextmanager
def download_lock(folder: Path) -> Iterator[None]:
    """Two downloads appending to the same partial files would corrupt them: one at a time."""
    state_dir(folder).mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir(folder) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SM120Error(
                f"another download is writing into {folder}",
                "wait for it to finish (or stop it), then run again",
            ) from None
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
