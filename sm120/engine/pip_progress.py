"""pip's output, read as progress: which package downloads, how many bytes of how many.

pip 24.1+ writes `Progress DONE of TOTAL` lines under `--progress-bar raw` (a parsable form
of its own bar, at most four a second); the package they belong to is named on the
`Downloading NAME (SIZE)` line before them. Everything else pip prints is a plain line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# pip 24.1 added `--progress-bar raw`; older pips only draw to a terminal.
PIP_WITH_RAW_PROGRESS = (24, 1)

_DOWNLOADING = re.compile(r"^\s*Downloading (?P<what>\S+)(?: \((?P<size>[^)]*)\))?\s*$")
_PROGRESS = re.compile(r"^Progress (?P<done>\d+) of (?P<total>\d+)$")
_PIP_VERSION = re.compile(r"^pip (?P<major>\d+)\.(?P<minor>\d+)")


@dataclass(frozen=True)
class DownloadStarted:
    package: str  # the file's name, without the index URL
    size: int = 0  # bytes, as the line states it ("(599.2 MB)"); 0 when it states none


@dataclass(frozen=True)
class DownloadAdvanced:
    done: int
    total: int  # 0 when the server sent no length


@dataclass(frozen=True)
class PlainLine:
    text: str


PipEvent = DownloadStarted | DownloadAdvanced | PlainLine


def parse_pip_line(line: str) -> PipEvent:
    progress = _PROGRESS.match(line.strip())
    if progress:
        return DownloadAdvanced(int(progress["done"]), int(progress["total"]))
    downloading = _DOWNLOADING.match(line)
    if downloading:
        return DownloadStarted(downloading["what"].rsplit("/", 1)[-1], _bytes(downloading["size"]))
    return PlainLine(line)


_SIZE = re.compile(r"^(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[kMG]?B)$")
# pip writes sizes in decimal units (its format_size: kB, MB, GB).
_UNITS = {"B": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}


def _bytes(size: str | None) -> int:
    found = _SIZE.match((size or "").strip())
    return round(float(found["number"]) * _UNITS[found["unit"]]) if found else 0


def has_raw_progress(pip_version_line: str) -> bool:
    """Whether `pip --version` names a pip that understands `--progress-bar raw`."""
    found = _PIP_VERSION.match(pip_version_line.strip())
    if not found:
        return False
    return (int(found["major"]), int(found["minor"])) >= PIP_WITH_RAW_PROGRESS
