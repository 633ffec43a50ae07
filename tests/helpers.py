"""What the tests share that is not a fixture: where things are, the CLI runner's call, and
small helpers for plan tests. Fixtures and hooks live in conftest.py; fake servers and
stand-ins in tests/fakes/."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from sm120.cli.app import app
from sm120.core.paths import shared_engines_home
from sm120.deploy.checked import CheckedPlan, checked_plan
from sm120.doctor.p2p import probe_script
from sm120.engine.engine_env import VLLM_CPU_VERSION
from sm120.monitor.metrics import MetricsSnapshot
from sm120.plan.fit import kv
from sm120.plan.hardware import Hardware
from sm120.plan.resolve import PlanRequest
from sm120.recipe.schema import ModelDims
from sm120.render.argv import render_argv

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA_DIR = TESTS / "data"  # captured outputs and logs the tests read (SOURCES.md in each folder)
GOLDEN_DIR = TESTS / "golden"  # rewritten by --update-golden
# The real engine for integration tests, provisioned once per machine and reused: the same
# folder `sm120 launch tiny` provisions into, so a newcomer installs it once.
ENGINE_CACHE = Path(
    os.environ.get("SM120_TEST_ENGINE_DIR")
    or shared_engines_home() / f"vllm-cpu-{VLLM_CPU_VERSION}"
)

SM120_X4 = Hardware(gpus=4, arch="sm_120", source="declared")


def invoke(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    """`sm120 ARGS` through the Typer runner: (exit code, stdout, stderr)."""
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def plan_for(
    recipe: str,
    *variants: str,
    sets: tuple[str, ...] = (),
    hardware: Hardware | None = None,
    **kwargs: Any,
) -> CheckedPlan:
    request = PlanRequest(recipe=recipe, variants=variants, sets=sets, **kwargs)
    return checked_plan(request, hardware)


def flag_value(argv: list[str], flag: str) -> str | None:
    """The token after `flag`, or '' for a bare switch, or None when absent."""
    if flag not in argv:
        return None
    index = argv.index(flag)
    nxt = argv[index + 1] if index + 1 < len(argv) else None
    return "" if nxt is None or nxt.startswith("--") else nxt


def argv_of(recipe: str, *variants: str, **kwargs: Any) -> list[str]:
    return render_argv(plan_for(recipe, *variants, **kwargs).plan)


def json_flag(argv: list[str], flag: str) -> Any:
    value = flag_value(argv, flag)
    assert value, f"{flag} missing"
    return json.loads(value)


def one_line_error(stderr: str) -> str:
    """The one `Error: ...` line a bad input must produce, and nothing else (no traceback)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Nothing listens on it (connections in TIME_WAIT do not count, as for a server)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def processes_in_group(pgid: int) -> list[int]:
    """Live processes whose process group is pgid, straight from /proc.

    Zombies are dead and left out: an orphaned grandchild waits for init to reap it, and
    init here (a sandbox agent) may never do so.
    """
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_text = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat_text[stat_text.rfind(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            pids.append(int(entry.name))
    return pids


FP8 = kv.KVDtype("fp8", fp8=True)


BF16 = kv.KVDtype("bfloat16", fp8=False, element_bytes=2)


DSV4 = ModelDims(
    num_hidden_layers=43,
    num_key_value_heads=1,
    head_dim=512,
    index_head_dim=128,
    compress_ratios=(0, 0, *([4, 128] * 20), 4, 0),
    sliding_window=128,
    num_nextn_predict_layers=1,
    max_position_embeddings=1048576,
)


def probes_running() -> list[str]:
    """Command lines of any process still running the probe script of this checkout."""
    script = str(probe_script())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if script in command:
            found.append(command)
    return found


def snap(generated: float, running: float = 1.0, prompt: float = 10.0) -> MetricsSnapshot:
    return MetricsSnapshot(
        at=0.0,
        mono=0.0,
        counters={"generation_tokens": generated, "prompt_tokens": prompt, "iterations": generated},
        running=running,
    )
