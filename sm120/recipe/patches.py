"""Patch stacks baked into images (images/<recipe>/patches/): read each patch's header so an
image's manifest and labels can say which fixes it carries and which failures they prevent.

A patch file is a unified diff against the engine's source tree root, preceded by a header
that `patch` ignores (everything before the first `diff `/`--- ` line):

    Subject: <one line: what it fixes>
    Failure-Ids: F04[, F05 ...]     ids from sm120/data/failures.yaml
    Seed: 000                       the user report it comes from
    Target: vllm 0.15.1             engine and the exact version the hunks were made against

    <free prose: symptom, cause, what changes>

`series` in the same folder lists the patch files in apply order (blank lines and `#`
comments allowed); images/<recipe>/apply-patches.sh applies them in that order.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error

PATCH_DIR = "patches"
SERIES_FILE = "series"
REQUIRED_FIELDS = ("Subject", "Failure-Ids", "Seed", "Target")

_FIELD_LINE = re.compile(r"^([A-Za-z][A-Za-z-]*):[ \t]*(.*)$")
_FAILURE_ID = re.compile(r"^F\d{2}[a-z]?$")
_SEED = re.compile(r"^\d{3}$")
_TARGET = re.compile(r"^([a-z][a-z0-9_.-]*) (\S+)$")
# Where the diff starts; `patch` treats the lines above as leading garbage.
_DIFF_START = ("diff ", "--- ", "Index: ")
_NEW_FILE_LINE = re.compile(r"^\+\+\+ b/(\S+)")


class PatchError(SM120Error):
    """A patch stack whose files or headers do not follow the format above."""


@dataclass(frozen=True)
class PatchInfo:
    """What one patch file says about itself, plus the paths its diff touches."""

    name: str  # the file name, e.g. 0001-glm4-moe-skip-missing-kv-scales.patch
    subject: str
    failure_ids: tuple[str, ...]
    seed: str
    engine: str
    engine_version: str
    files: tuple[str, ...]
    description: str
    sha256: str

    def manifest_entry(self) -> dict[str, Any]:
        """The JSON-ready record an image manifest lists for this patch."""
        return {
            "name": self.name,
            "subject": self.subject,
            "failure_ids": list(self.failure_ids),
            "seed": self.seed,
            "target": f"{self.engine} {self.engine_version}",
            "files": list(self.files),
            "sha256": self.sha256,
        }


def parse_patch(text: str, name: str) -> PatchInfo:
    """Read the header and touched files of one patch file's text (`name` is its file name)."""
    lines = text.splitlines()
    body_at = next((i for i, line in enumerate(lines) if line.startswith(_DIFF_START)), None)
    if body_at is None:
        raise PatchError(f"{name}: no diff found", "a patch is a header followed by `diff -u`")
    fields, description = _header_fields(lines[:body_at], name)
    files = tuple(m.group(1) for line in lines[body_at:] if (m := _NEW_FILE_LINE.match(line)))
    if not files:
        raise PatchError(f"{name}: the diff names no '+++ b/...' file", "regenerate it: diff -u")
    engine, version = _target(fields["Target"], name)
    return PatchInfo(
        name=name,
        subject=fields["Subject"],
        failure_ids=_failure_ids(fields["Failure-Ids"], name),
        seed=_seed(fields["Seed"], name),
        engine=engine,
        engine_version=version,
        files=files,
        description=description,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
    )


def read_patch(path: Path) -> PatchInfo:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PatchError(f"cannot read {path}: {exc.strerror}", "check the series file") from exc
    return parse_patch(text, path.name)


def read_series(patch_dir: Path) -> list[PatchInfo]:
    """The patches of `patch_dir` in apply order; every *.patch file must be in the series."""
    series = patch_dir / SERIES_FILE
    if not series.is_file():
        raise PatchError(f"no {SERIES_FILE} file in {patch_dir}", "list the patches in apply order")
    names = [
        entry.strip()
        for entry in series.read_text(encoding="utf-8").splitlines()
        if entry.strip() and not entry.lstrip().startswith("#")
    ]
    if len(set(names)) != len(names):
        raise PatchError(f"{series} lists a patch twice", "each patch is applied once")
    unlisted = sorted({p.name for p in patch_dir.glob("*.patch")} - set(names))
    if unlisted:
        raise PatchError(
            f"{', '.join(unlisted)} in {patch_dir} is not in {SERIES_FILE}",
            "add it to the series or delete it",
        )
    return [read_patch(patch_dir / name) for name in names]


def read_stack(context_dir: Path) -> list[PatchInfo]:
    """The patch stack of an image build context (images/<recipe>/); [] when it has none."""
    patch_dir = context_dir / PATCH_DIR
    return read_series(patch_dir) if patch_dir.is_dir() else []


def check_target(patches: list[PatchInfo], engine: str, version: str) -> None:
    """Refuse a stack made for another engine build: its hunks would land in the wrong code."""
    for info in patches:
        if (info.engine, info.engine_version) != (engine, version):
            raise PatchError(
                f"{info.name} targets {info.engine} {info.engine_version}, "
                f"the image carries {engine} {version}",
                "port the patch to that version and update its Target header",
            )


def check_failure_ids(patches: list[PatchInfo], known_ids: set[str]) -> None:
    """Every failure id a patch names must be in the catalogue (sm120.logs.failures)."""
    for info in patches:
        unknown = [fid for fid in info.failure_ids if fid not in known_ids]
        if unknown:
            raise PatchError(
                f"{info.name} names unknown failure id {', '.join(unknown)}",
                "use an id from sm120/data/failures.yaml",
            )


def manifest(patches: list[PatchInfo]) -> list[dict[str, Any]]:
    """The `patches` list of an image manifest, in apply order."""
    return [info.manifest_entry() for info in patches]


def label_value(patches: list[PatchInfo]) -> str:
    """A compact one-line form for a Docker label: `name=F04;name=F05,F06`."""
    return ";".join(f"{info.name}={','.join(info.failure_ids)}" for info in patches)


def _header_fields(header: list[str], name: str) -> tuple[dict[str, str], str]:
    """Split the header into its `Key: value` block and the prose after the first blank line."""
    prose_at = next((i for i, line in enumerate(header) if not line.strip()), len(header))
    fields: dict[str, str] = {}
    for number, line in enumerate(header[:prose_at], start=1):
        match = _FIELD_LINE.match(line)
        if match is None:
            raise PatchError(
                f"{name}: header line {number} is not 'Key: value': {line.strip()[:60]}",
                "leave a blank line between the header fields and the description",
            )
        key, value = match.group(1), match.group(2).strip()
        if key not in REQUIRED_FIELDS:
            raise PatchError(
                f"{name}: unknown header field '{key}'",
                f"the fields are {', '.join(REQUIRED_FIELDS)}",
            )
        if key in fields:
            raise PatchError(f"{name}: header field '{key}' appears twice", "keep one")
        fields[key] = value
    missing = [key for key in REQUIRED_FIELDS if not fields.get(key)]
    if missing:
        raise PatchError(
            f"{name}: header is missing {', '.join(missing)}",
            "start the file with Subject, Failure-Ids, Seed and Target lines",
        )
    return fields, "\n".join(header[prose_at:]).strip()


def _failure_ids(value: str, name: str) -> tuple[str, ...]:
    ids = tuple(part.strip() for part in value.split(",") if part.strip())
    bad = [fid for fid in ids if not _FAILURE_ID.match(fid)]
    if bad or not ids:
        raise PatchError(
            f"{name}: Failure-Ids '{value}' is not a list of ids like F04",
            "separate several ids with commas",
        )
    return ids


def _seed(value: str, name: str) -> str:
    if not _SEED.match(value):
        raise PatchError(f"{name}: Seed '{value}' is not a seed number like 000", "use NNN")
    return value


def _target(value: str, name: str) -> tuple[str, str]:
    match = _TARGET.match(value)
    if match is None:
        raise PatchError(
            f"{name}: Target '{value}' is not '<engine> <version>'", "e.g. Target: vllm 0.15.1"
        )
    return match.group(1), match.group(2)
