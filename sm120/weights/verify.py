"""Is a checkpoint folder complete? Reads only headers, so it takes a second even for 300 GB.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON naming each
tensor's dtype, shape and [begin, end) byte range in the data section, then the data. The
loader refuses a file whose length is not exactly 8 + N + the largest `end` - which is what
an interrupted copy or download leaves behind - so that is the check made here, for every
shard `model.safetensors.index.json` names (or the single `model.safetensors`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sm120.weights.download_record import read_manifest

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# The reference loader rejects larger headers; a bigger length means a corrupt file.
MAX_HEADER_BYTES = 100 * 1024 * 1024

Status = Literal["ok", "missing", "truncated", "oversized", "unreadable"]


@dataclass(frozen=True)
class SafetensorsHeader:
    header_bytes: int
    tensors: frozenset[str]
    data_bytes: int  # the largest data_offsets end: the data section's length

    @property
    def expected_size(self) -> int:
        return 8 + self.header_bytes + self.data_bytes


class HeaderError(ValueError):
    """The first bytes of a file are not a safetensors header."""

    def __init__(self, message: str, *, truncated: bool = False) -> None:
        super().__init__(message)
        self.truncated = truncated


def read_header(path: Path) -> SafetensorsHeader:
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise HeaderError(f"{size} bytes, less than the 8-byte header length", truncated=True)
        length = int.from_bytes(prefix, "little")
        if length == 0 or length > MAX_HEADER_BYTES:
            raise HeaderError(f"header length {length} is not plausible")
        if 8 + length > size:
            raise HeaderError(f"{size} bytes, ends inside its {length}-byte header", truncated=True)
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise HeaderError(f"header is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object")
    return SafetensorsHeader(length, frozenset(_tensor_names(header)), _data_end(header))


def _tensor_names(header: dict[str, Any]) -> list[str]:
    return [name for name in header if name != "__metadata__"]


def _data_end(header: dict[str, Any]) -> int:
    end = 0
    for name in _tensor_names(header):
        entry = header[name]
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise HeaderError(f"tensor {name!r} has no valid data_offsets")
        end = max(end, offsets[1])
    return end


@dataclass(frozen=True)
class ShardCheck:
    file: str
    status: Status
    size: int | None = None
    expected_size: int | None = None
    detail: str | None = None

    def describe(self) -> str:
        if self.status == "missing":
            return f"{self.file}: missing"
        if self.status == "truncated" and self.expected_size is not None:
            return f"{self.file}: truncated ({self.size:,} of {self.expected_size:,} bytes)"
        if self.status == "oversized":
            extra = (self.size or 0) - (self.expected_size or 0)
            return f"{self.file}: {extra:,} bytes longer than its header says"
        return f"{self.file}: {self.status} ({self.detail})"


@dataclass(frozen=True)
class WeightsReport:
    folder: Path
    config: bool
    layout: Literal["index", "single", "none"]
    shards: tuple[ShardCheck, ...] = ()
    problems: tuple[str, ...] = ()  # every reason the folder is not servable, one line each
    total_bytes: int = 0
    manifest_missing: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_shards(self) -> list[ShardCheck]:
        return [shard for shard in self.shards if shard.status != "ok"]

    def summary(self, limit: int = 4) -> str:
        """The problems in one line, for error messages."""
        shown = "; ".join(self.problems[:limit])
        more = len(self.problems) - limit
        return shown + (f"; and {more} more" if more > 0 else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "dir": str(self.folder),
            "ok": self.ok,
            "config": self.config,
            "layout": self.layout,
            "shards": [
                {
                    "file": s.file,
                    "status": s.status,
                    "size": s.size,
                    "expected_size": s.expected_size,
                    "detail": s.detail,
                }
                for s in self.shards
            ],
            "problems": list(self.problems),
            "total_bytes": self.total_bytes,
        }


def check_shard(folder: Path, name: str) -> tuple[ShardCheck, SafetensorsHeader | None]:
    path = folder / name
    if not path.is_file():
        return ShardCheck(name, "missing"), None
    size = path.stat().st_size
    try:
        header = read_header(path)
    except HeaderError as exc:
        status: Status = "truncated" if exc.truncated else "unreadable"
        return ShardCheck(name, status, size=size, detail=str(exc)), None
    except OSError as exc:
        return ShardCheck(name, "unreadable", size=size, detail=exc.strerror or str(exc)), None
    expected = header.expected_size
    if size < expected:
        return ShardCheck(name, "truncated", size=size, expected_size=expected), header
    if size > expected:
        return ShardCheck(name, "oversized", size=size, expected_size=expected), header
    return ShardCheck(name, "ok", size=size, expected_size=expected), header


def _safe_name(name: object) -> bool:
    # Index entries become paths: keep them inside the folder.
    if not isinstance(name, str) or not name or name.startswith("/"):
        return False
    return ".." not in Path(name).parts


def _index_map(folder: Path, problems: list[str]) -> dict[str, str] | None:
    try:
        index = json.loads((folder / INDEX_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        problems.append(f"{INDEX_FILE}: not readable JSON ({exc.__class__.__name__})")
        return None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        problems.append(f"{INDEX_FILE}: has no weight_map")
        return None
    unsafe = sorted({str(v) for v in weight_map.values() if not _safe_name(v)})
    if unsafe:
        problems.append(f"{INDEX_FILE}: names files outside the folder ({', '.join(unsafe)})")
        return None
    return {str(tensor): str(shard) for tensor, shard in weight_map.items()}


def _check_index(folder: Path, problems: list[str]) -> list[ShardCheck]:
    weight_map = _index_map(folder, problems)
    if weight_map is None:
        return []
    by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(tensor)
    checks: list[ShardCheck] = []
    absent: list[tuple[str, str]] = []
    for shard, tensors in sorted(by_shard.items()):
        check, header = check_shard(folder, shard)
        checks.append(check)
        if header is not None:
            absent += [(t, shard) for t in tensors if t not in header.tensors]
    problems += [check.describe() for check in checks if check.status != "ok"]
    if absent:
        tensor, shard = absent[0]
        problems.append(
            f"{len(absent)} tensor(s) the index lists are not in their shard "
            f"(first: {tensor} in {shard})"
        )
    return checks


def _check_manifest(folder: Path, checked: set[str], problems: list[str]) -> tuple[str, ...]:
    """Files `sm120 download` fetched besides the shards (tokenizer, chat template, ...);
    `checked` names those already reported on."""
    manifest = read_manifest(folder)
    if manifest is None:
        return ()
    missing = tuple(
        path
        for path, remote in sorted(manifest.files.items())
        if not (folder / path).is_file() or (folder / path).stat().st_size != remote.size
    )
    for path in missing:
        if path not in checked:
            problems.append(f"{path}: missing or incomplete (downloaded from {manifest.repo})")
    return missing


def verify_dir(folder: Path) -> WeightsReport:
    """Everything that keeps `folder` from loading, without reading tensor data."""
    problems: list[str] = []
    config = (folder / CONFIG_FILE).is_file()
    if not config:
        problems.append(f"{CONFIG_FILE}: missing")
    if (folder / INDEX_FILE).is_file():
        layout: Literal["index", "single", "none"] = "index"
        shards = _check_index(folder, problems)
    elif (folder / SINGLE_FILE).exists():
        layout = "single"
        check, _ = check_shard(folder, SINGLE_FILE)
        shards = [check]
        problems += [check.describe()] if check.status != "ok" else []
    else:
        layout, shards = "none", []
        problems.append(f"no {INDEX_FILE} and no {SINGLE_FILE}")
    checked = {CONFIG_FILE, INDEX_FILE, *(shard.file for shard in shards)}
    manifest_missing = _check_manifest(folder, checked, problems)
    total = sum(shard.size or 0 for shard in shards)
    return WeightsReport(
        folder, config, layout, tuple(shards), tuple(problems), total, manifest_missing
    )
