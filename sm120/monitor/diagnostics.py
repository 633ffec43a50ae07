"""What a wedge leaves behind for a post-mortem: the log tail, the metrics page, and a
py-spy dump of every engine process (when py-spy is installed and may attach)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

KEEP_CAPTURES = 10
PY_SPY_TIMEOUT_S = 30.0


def py_spy_executable() -> str | None:
    """py-spy on PATH, or next to this interpreter (a venv's bin/ is not always on PATH)."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file():
        return str(beside)
    return shutil.which("py-spy")


def py_spy_dump(executable: str, pid: int, timeout_s: float = PY_SPY_TIMEOUT_S) -> str:
    """The Python stacks of one process, or why they could not be read.

    A normal dump pauses the process for a moment, which fails on a process that is itself
    stopped; then a non-blocking read (no pause, possibly torn) is the fallback.
    """
    outcome = ""
    for extra in ([], ["--nonblocking"]):
        argv = [executable, "dump", "--pid", str(pid), *extra]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            outcome += f"$ {' '.join(argv)}\n(timed out after {timeout_s:.0f} s)\n"
            continue
        outcome += f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}"
        if done.returncode == 0:
            return outcome
    return outcome


def capture_wedge(
    directory: Path,
    *,
    summary: dict[str, Any],
    log_tail: Iterable[str],
    metrics_text: str | None,
    pids: list[int],
    at: float | None = None,
) -> Path:
    """Write one capture directory and return it; older captures beyond KEEP_CAPTURES go."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(at or time.time()))
    target = directory / f"wedge-{stamp}"
    suffix = 1
    while target.exists():
        suffix += 1
        target = directory / f"wedge-{stamp}-{suffix}"
    target.mkdir(mode=0o700, parents=True)
    (target / "log_tail.txt").write_text("\n".join(log_tail) + "\n", encoding="utf-8")
    if metrics_text is not None:
        (target / "metrics.txt").write_text(metrics_text, encoding="utf-8")
    executable = py_spy_executable()
    dumped: dict[str, str] = {}
    for pid in pids:
        if executable is None:
            break
        name = f"py-spy-{pid}.txt"
        (target / name).write_text(py_spy_dump(executable, pid), encoding="utf-8")
        dumped[str(pid)] = name
    record = {
        **summary,
        "pids": pids,
        "py_spy": dumped if executable else "py-spy is not installed",
    }
    (target / "summary.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    _prune(directory)
    return target


def _prune(directory: Path) -> None:
    # Names carry the UTC time, so name order is age order.
    captures = sorted(path for path in directory.glob("wedge-*") if path.is_dir())
    for old in captures[:-KEEP_CAPTURES]:
        shutil.rmtree(old, ignore_errors=True)
