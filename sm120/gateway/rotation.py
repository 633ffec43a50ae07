"""The gateway's logs rotated by size: one file grows to a bound, then moves to NAME.1 (and
NAME.1 to NAME.2, ...), the oldest beyond `kept` dropped, so no log can fill the disk."""

from __future__ import annotations

from pathlib import Path


def rotate_if_full(path: Path, adding: int, max_bytes: int, kept: int) -> None:
    """Rotate `path` first when `adding` more bytes would take it past `max_bytes`."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size + adding <= max_bytes:
        return
    for index in range(kept - 1, 0, -1):
        older = path.with_name(f"{path.name}.{index}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{index + 1}"))
    path.replace(path.with_name(f"{path.name}.1"))
    path.with_name(f"{path.name}.{kept + 1}").unlink(missing_ok=True)
