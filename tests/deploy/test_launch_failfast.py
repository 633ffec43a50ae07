"""`sm120 launch` through the real native runtime with a stand-in engine that prints a real
fatal start-up and hangs (tests/fakes/standin_engine.py): the launch ends in seconds, not after the
ready timeout, names the failure in one line, exits 2 and leaves nothing running."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.fakes.standin import (
    FAILURE_LINE,
    FATAL_STARTUPS,
    VLLM_LOGS,
    make_engine_python,
    make_model_dir,
)
from tests.helpers import free_port, port_is_free
from tests.integration.realstack import engine_processes, sm120, state_of

# (log the stand-in prints, the phase it died in, the failure named, the hint)
CASES = {
    "vllm-0.9.1-engine-core-died": (
        VLLM_LOGS / "v0.9.1_data_parallel_engine_dead.log",
        "starting",
        "AttributeError: 'DPEngineCoreProc' object has no attribute 'dp_rank'",
        "see the log lines above",
    ),
    "vllm-0.11-kv-cache-too-small": (
        VLLM_LOGS / "v0.11_cpu_kv_too_small.log",
        "starting",
        "F08 Long context does not fit the KV cache (estimated maximum model length too small)",
        "F08: Shard the MLA KV with --decode-context-parallel-size equal to the TP size, or lower "
        "--max-model-len to the estimate in the message.",
    ),
    "vllm-0.32.0-no-cxx-compiler": (
        FATAL_STARTUPS / "vllm_0.32.0_cpu_no_cxx_compiler.log",
        "compiling",
        "RuntimeError: Worker failed with error 'InvalidCxxCompiler: No working C++ compiler",
        "see the log lines above",
    ),
}
# Long enough to tell a fail-fast from the timeout, short enough that a regression ends.
READY_TIMEOUT_S = 60


def wait_until_gone(port: int, timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while engine_processes(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    return engine_processes(port)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_lost_start_ends_the_launch_in_seconds(case: str, tmp_path: Path) -> None:
    log, phase, named, hint = CASES[case]
    python = make_engine_python(tmp_path, log)
    home, port = tmp_path / "home", free_port()
    started = time.monotonic()
    launched = sm120(
        home, "launch", "tiny", "--vllm-python", str(python), "--model-dir",
        str(make_model_dir(tmp_path)), "--port", str(port), "--no-monitor",
        "--timeout", str(READY_TIMEOUT_S), timeout=180,
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert launched.returncode == 2, launched.stderr[-3000:]
    last = launched.stderr.strip().splitlines()[-1]
    found = FAILURE_LINE.fullmatch(last)
    assert found, last
    assert int(found[1]) < 10  # since the wait began: when the stand-in printed the lines
    assert found[2] == phase
    assert found[3].startswith(named)
    assert found[4] == hint
    assert seconds < 30, f"took {seconds:.0f} s"
    assert wait_until_gone(port) == []
    assert port_is_free(port)
    assert state_of(home) is None
