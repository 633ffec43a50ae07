"""The door through which doctor's checks run other programs. Checks receive a Runner, so
tests hand in a fake one and the live machine gets `run_command`. Two callers outside the
checks run their own: detect.py (launch's one nvidia-smi query) and p2p.py (the probe)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

NOT_FOUND = 127
TIMED_OUT = 124


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def missing(self) -> bool:
        return self.returncode == NOT_FOUND

    def text(self) -> str:
        return (self.stdout + "\n" + self.stderr).strip()


Runner = Callable[[Sequence[str]], RunResult]


def run_command(argv: Sequence[str], timeout: float = 20.0) -> RunResult:
    """argv as a list (never a shell string); a missing program is exit 127, like a shell."""
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return RunResult(NOT_FOUND, "", f"{argv[0]}: command not found")
    except PermissionError as exc:
        return RunResult(126, "", f"{argv[0]}: {exc.strerror}")
    except subprocess.TimeoutExpired:
        return RunResult(TIMED_OUT, "", f"{argv[0]} did not answer within {timeout:.0f}s")
    return RunResult(done.returncode, done.stdout, done.stderr)
