"""The monitor's poll loop, driven step by step against a scripted /health + /metrics server
and a stand-in target (what the real runtime does is covered by the integration tests)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sm120.engine.gpu_readings import GpuReading, NoGpus, ScriptedSource
from sm120.engine.runtime.base import ExitInfo
from sm120.monitor.files import MonitorFiles, MonitorSettings
from sm120.monitor.poll_loop import MonitorService
from sm120.monitor.summary import monitor_summary, summary_lines
from sm120.monitor.watched import ServerState
from tests.fakes.openai_server import FakeOpenAIServer


class ScriptedServer(FakeOpenAIServer):
    """The fake server, its /metrics read from the gauges and counters set on it."""

    def __init__(self) -> None:
        super().__init__(model="m")
        self.running = 0.0
        self.generation = 0.0
        self.prompt = 0.0
        self.started = 1000.0

    def metrics_text(self) -> str:
        labels = '{engine="0",model_name="m"}'
        return (
            f"process_start_time_seconds {self.started}\n"
            f"vllm:num_requests_running{labels} {self.running}\n"
            f"vllm:num_requests_waiting{labels} 0.0\n"
            f"vllm:kv_cache_usage_perc{labels} 0.125\n"
            f"vllm:prompt_tokens_total{labels} {self.prompt}\n"
            f"vllm:generation_tokens_total{labels} {self.generation}\n"
            f"vllm:iteration_tokens_total_count{labels} {self.generation}\n"
        )


class StandInTarget:
    def __init__(self, server: ScriptedServer, restartable: bool = True) -> None:
        self.server_ = server
        self.running = True
        self.exit: ExitInfo | None = None
        self.generation_id = 1
        self.restarts = 0
        self.stops = 0
        self.restartable = restartable

    @property
    def base_url(self) -> str:
        return self.server_.url

    def api_key(self) -> str | None:
        return "secret-key"

    def server(self) -> ServerState:
        return ServerState(self.running, f"native:{self.generation_id}", self.exit)

    def engine_pids(self) -> list[int]:
        return []

    def can_restart(self) -> bool:
        return self.restartable

    def restart(self, stop_timeout_s: float) -> None:
        self.restarts += 1
        self.generation_id += 1
        self.running, self.exit = True, None
        # The new server starts from zero and has nothing running yet.
        self.server_.started += 100
        self.server_.generation = self.server_.prompt = self.server_.running = 0.0

    def stop_server(self, stop_timeout_s: float) -> None:
        self.stops += 1

    def gone(self) -> bool:
        return False


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


def make(
    tmp_path: Path, server: ScriptedServer, **settings: Any
) -> tuple[MonitorService, StandInTarget, Clock, list[str]]:
    files = MonitorFiles(tmp_path / "deployment")
    files.make_dirs()
    said: list[str] = []
    target = StandInTarget(server, restartable=settings.pop("restartable", True))
    clock = Clock()
    defaults: dict[str, Any] = {"poll_s": 1.0, "wedge_timeout_s": 10.0, "image": "img"}
    # Unit tests never read the machine's GPUs: a scripted source, or none.
    gpus = settings.pop("gpu_source", None) or NoGpus()
    config = MonitorSettings(**{**defaults, **settings})
    config.save(files.settings)
    service = MonitorService(target, files, config, clock=clock, say=said.append, gpu_source=gpus)
    return service, target, clock, said


def kinds(service: MonitorService) -> list[str]:
    return [alert.kind for alert in service.alerts]


def test_rates_peaks_history_and_the_api_key(tmp_path: Path, scripted: ScriptedServer) -> None:
    service, _target, clock, _ = make(tmp_path, scripted)
    service.step()
    scripted.running, scripted.generation, scripted.prompt = 1.0, 300.0, 1000.0
    clock.now += 5
    service.step()
    live = json.loads(service.files.live.read_text())
    assert live["activity"] == "serving" and live["phase"] == "ready"
    assert live["kv_usage_pct"] == 12.5
    assert service.rates is not None
    peaks = json.loads(service.files.peak.read_text())
    assert peaks["peak_running"] == 1 and peaks["image"] == "img"
    assert peaks["peak_decode_tps"] > 0
    history = service.files.history.read_text().splitlines()
    assert len(history) == 2
    assert set(scripted.authorizations) == {"Bearer secret-key"}


def test_polling_leaves_the_port_free_when_the_server_dies(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    """A relaunch on the same port must not find it held by the monitor's connection."""
    import socket

    service, _target, clock, _ = make(tmp_path, scripted)
    for _ in range(3):
        service.step()
        clock.now += 1
    port = int(scripted.url.rsplit(":", 1)[1])
    scripted.stop()  # the server dies while the monitor is between polls
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_a_restarted_server_does_not_make_a_fake_peak(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, _target, clock, _ = make(tmp_path, scripted)
    scripted.generation = 100.0
    service.step()
    clock.now += 1
    service.step()
    # The server restarted between two polls and already did a lot of work: no rate from it.
    scripted.started += 50
    scripted.generation = 50_000.0
    clock.now += 1
    service.step()
    assert service.rates is not None and service.rates.restarted
    assert json.loads(service.files.peak.read_text())["peak_decode_tps"] < 1000


def test_a_dead_server_is_reported_once_and_ends_the_monitor(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, target, clock, said = make(tmp_path, scripted, dead_grace_s=30.0)
    service.step()
    target.running = False
    target.exit = ExitInfo(returncode=None, signal=9, ended_at=0.0)
    for _ in range(3):
        clock.now += 10
        service.step()
    assert kinds(service) == ["died"]
    assert service.alerts[0].message == "the server killed by SIGKILL"
    assert not service.finished
    clock.now += 10
    service.step()
    assert service.finished
    assert json.loads(service.files.live.read_text())["exit"] == "killed by SIGKILL"
    assert any("died: the server killed by SIGKILL" in line for line in said)


def test_health_503_is_an_alert_per_episode(tmp_path: Path, scripted: ScriptedServer) -> None:
    service, _target, clock, _ = make(tmp_path, scripted)
    scripted.health_status = 503
    for _ in range(3):
        clock.now += 1
        service.step()
    scripted.health_status = 200
    service.step()
    scripted.health_status = 503
    service.step()
    assert kinds(service) == ["health", "health"]
    assert service.alerts[0].message.startswith("/health answers 503")


def wedge(service: MonitorService, scripted: ScriptedServer, clock: Clock) -> None:
    """Requests running, tokens frozen, for longer than the wedge timeout."""
    scripted.running = 1.0
    scripted.generation += 7
    service.step()
    for _ in range(12):
        clock.now += 1
        service.step()


def test_wedge_without_restart_captures_diagnostics_once(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, target, clock, _ = make(tmp_path, scripted, restart_on_wedge=False)
    service.files.serve_log.write_text("an engine line\n")
    service.step()
    wedge(service, scripted, clock)
    assert kinds(service) == ["wedge", "wedge"]
    assert service.alerts[1].message == (
        "not restarting: the recipe's monitor.restart_on_wedge is off"
    )
    assert target.restarts == 0
    captures = list(service.files.diagnostics.glob("wedge-*"))
    assert len(captures) == 1  # once per wedge, not once per poll
    capture = captures[0]
    assert (capture / "log_tail.txt").read_text() == "an engine line\n"
    assert "vllm:generation_tokens_total" in (capture / "metrics.txt").read_text()
    summary = json.loads((capture / "summary.json").read_text())
    assert summary["running"] == 1 and summary["frozen_for_s"] >= 10


def test_wedges_restart_until_the_breaker_gives_up(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, target, clock, _ = make(tmp_path, scripted, restart_on_wedge=True, max_restarts=1)
    service.step()
    wedge(service, scripted, clock)
    assert target.restarts == 1
    assert kinds(service) == ["wedge", "restart"]
    assert service.alerts[1].message == "restarting the server (watchdog restart 1 of 1)"
    wedge(service, scripted, clock)
    assert target.restarts == 1  # the breaker held
    assert kinds(service)[-2:] == ["wedge", "gave_up"]
    assert service.alerts[-1].message == (
        "gave up: 1 watchdog restarts in the last 6 h (limit 1); not restarting again (F26)"
    )
    marker = json.loads(service.files.watchdog.read_text())
    assert clock.now - 5 <= marker["gave_up_at"] <= clock.now
    assert len(marker["restarts"]) == 1
    summary = monitor_summary(service.files)
    assert summary["watchdog"]["gave_up"] is True
    text = "\n".join(summary_lines(summary))
    assert "GAVE UP   at " in text and "not restarting again (F26)" in text


def test_a_target_that_cannot_restart_only_alerts(tmp_path: Path, scripted: ScriptedServer) -> None:
    service, target, clock, _ = make(tmp_path, scripted, restart_on_wedge=True, restartable=False)
    service.step()
    wedge(service, scripted, clock)
    assert target.restarts == 0
    assert service.alerts[-1].message == "not restarting: this monitor cannot restart the server"


def test_compiling_is_not_a_wedge(tmp_path: Path, scripted: ScriptedServer) -> None:
    service, target, clock, _ = make(tmp_path, scripted, restart_on_wedge=True)
    service.step()
    clock.now += 1
    with service.files.serve_log.open("a") as log:
        log.write("(EngineCore pid=7) INFO [monitor.py:40] Starting torch.compile\n")
    wedge(service, scripted, clock)
    assert service.activity == "compiling"
    assert kinds(service) == [] and target.restarts == 0


def test_restart_loop_is_reported(tmp_path: Path, scripted: ScriptedServer) -> None:
    service, target, clock, _ = make(tmp_path, scripted)
    service.step()
    for _ in range(3):
        target.generation_id += 1  # something else keeps starting the server again
        clock.now += 60
        service.step()
    assert kinds(service) == ["restart_loop"]
    assert service.alerts[0].message == ("restart loop: the server started 3 times in 15 min (F26)")


def test_catalogue_failures_in_the_log_are_alerts(tmp_path: Path, scripted: ScriptedServer) -> None:
    service, _target, _clock, _ = make(tmp_path, scripted)
    service.files.serve_log.write_text(
        "(EngineCore pid=9) ERROR ValueError: Unknown attention backend: 'TRITON'. "
        "Valid options are: FLASH_ATTN, TRITON_ATTN\n"
    )
    service.step()
    assert kinds(service) == ["failure"]
    assert service.alerts[0].message.startswith("F02 ")


def test_a_restart_that_never_gets_ready_is_reported(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, target, clock, _ = make(
        tmp_path, scripted, restart_on_wedge=True, ready_timeout_s=30.0
    )
    restart = target.restart

    def restart_unhealthy(stop_timeout_s: float) -> None:
        restart(stop_timeout_s)
        scripted.health_status = 500  # the new server answers, but never becomes healthy

    target.restart = restart_unhealthy  # type: ignore[method-assign]
    service.step()
    wedge(service, scripted, clock)
    assert target.restarts == 1
    for _ in range(40):
        clock.now += 1
        service.step()
    assert kinds(service)[-1] == "not_ready"
    assert service.alerts[-1].message == "the restarted server is not ready after 31 s"


SPINNING = GpuReading(0, util_pct=100.0, power_w=540.0, power_limit_w=600.0, temperature_c=83.0)


def test_busy_gpus_hold_off_the_wedge_and_restart_as_a_livelock(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, target, clock, _ = make(
        tmp_path,
        scripted,
        restart_on_wedge=True,
        livelock_s=30.0,
        gpu_source=ScriptedSource([[SPINNING]]),
    )
    service.step()
    wedge(service, scripted, clock)  # 12 s frozen: past the wedge timeout
    assert service.activity == "stalled" and target.restarts == 0
    for _ in range(20):
        clock.now += 1
        service.step()
    assert target.restarts == 1
    assert kinds(service) == ["livelock", "restart"]
    # Frozen since the poll with the last progress, busy since the next one: 31 s and 30 s.
    capture = next(service.files.diagnostics.glob("wedge-*"))
    assert service.alerts[0].message == (
        "livelock: 1 request(s) running and token counters frozen for 31 s while the GPUs "
        f"stay busy (GPU0 100% 540 W); diagnostics in {capture}"
    )
    assert service.alerts[1].message == (
        "restarting the server after a livelock (watchdog restart 1 of 3)"
    )
    summary = json.loads((capture / "summary.json").read_text())
    assert summary["verdict"] == "livelock" and summary["gpus"][0]["power_w"] == 540.0


def test_gpu_readings_are_published_and_kept_in_the_history(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, _target, clock, _ = make(tmp_path, scripted, gpu_source=ScriptedSource([[SPINNING]]))
    service.step()
    clock.now += 1
    service.step()
    live = json.loads(service.files.live.read_text())
    assert live["gpus"] == [SPINNING.as_dict()]
    assert live["watchdog"]["livelock_s"] == 300.0
    history = [json.loads(line) for line in service.files.history.read_text().splitlines()]
    assert history[-1]["gpus"] == [SPINNING.as_dict()]


def test_without_gpus_the_published_list_is_empty(tmp_path: Path, scripted: ScriptedServer) -> None:
    service, _target, _clock, _ = make(tmp_path, scripted)
    service.step()
    assert json.loads(service.files.live.read_text())["gpus"] == []


ON_FAILURE_2 = {
    "restart_on_death": True,
    "restart_policy": "on-failure:2",
    "max_restarts": 2,
    "restart_backoff_s": 5.0,
}


def die(target: StandInTarget, returncode: int | None = None, signum: int | None = 9) -> None:
    target.running = False
    target.exit = ExitInfo(returncode=returncode, signal=signum, ended_at=0.0)


def test_a_dead_server_is_relaunched_with_backoff_until_the_breaker_opens(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, target, clock, said = make(tmp_path, scripted, **ON_FAILURE_2)
    service.step()
    with service.files.serve_log.open("a") as log:
        log.write("".join(f"engine line {n}\n" for n in range(30)))
    die(target)
    service.step()
    assert target.restarts == 1
    assert kinds(service) == ["died", "restart"]
    assert service.alerts[-1].message == (
        "the engine killed by SIGKILL: relaunching the server (watchdog restart 1 of 2)"
    )
    (record,) = service.breaker.state.records
    assert (record.kind, record.reason) == ("died", "the engine killed by SIGKILL")
    assert record.log_tail == [f"engine line {n}" for n in range(10, 30)]

    clock.now += 1
    service.step()  # it runs again
    die(target)
    clock.now += 1
    service.step()
    assert target.restarts == 1  # 2 s after the last restart: 3 s of backoff still to wait
    assert service.alerts[-1].message == "the server killed by SIGKILL; relaunching in 3 s"
    clock.now += 3
    service.step()
    assert target.restarts == 2 and not service.finished

    clock.now += 1
    die(target, returncode=1, signum=None)
    service.step()
    assert target.restarts == 2 and target.stops == 1 and service.finished
    assert service.alerts[-1].message == (
        "gave up: the server exited with code 1 after 2 watchdog restarts in the last 6 h "
        "(limit 2); not relaunching again (F26)"
    )
    assert "the breaker is open: the server stays stopped and the monitor ends" in said
    summary = monitor_summary(service.files)["watchdog"]
    assert (summary["breaker"], summary["restart_policy"]) == ("open", "on-failure:2")
    assert [r["kind"] for r in summary["restarts"]] == ["died", "died"]
    text = "\n".join(summary_lines(monitor_summary(service.files)))
    assert "  restart   policy on-failure:2, breaker open" in text
    assert "died: the engine killed by SIGKILL" in text
    assert "            last line: engine line 29" in text


def test_a_clean_exit_is_not_relaunched(tmp_path: Path, scripted: ScriptedServer) -> None:
    service, target, clock, _ = make(tmp_path, scripted, dead_grace_s=30.0, **ON_FAILURE_2)
    service.step()
    die(target, signum=15)
    service.step()
    assert target.restarts == 0 and kinds(service) == ["died", "clean_exit"]
    assert service.alerts[-1].message == (
        "not relaunching: the engine killed by SIGTERM, which is a stop, not a failure "
        "(restart policy on-failure:2)"
    )
    clock.now += 31
    service.step()
    assert service.finished and target.restarts == 0 and target.stops == 0


def test_a_server_gone_without_a_word_is_relaunched(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, target, _, _ = make(tmp_path, scripted, **ON_FAILURE_2)
    service.step()
    target.running, target.exit = False, None
    service.step()
    assert target.restarts == 1
    assert service.breaker.state.records[0].reason == ("the engine went away (exit status unknown)")


def test_without_the_policy_a_dead_server_is_never_relaunched(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, target, clock, _ = make(tmp_path, scripted, restart_on_wedge=True)
    service.step()
    die(target)
    for _ in range(3):
        clock.now += 10
        service.step()
    assert target.restarts == 0 and kinds(service) == ["died"]


def test_a_node_that_died_is_named_and_only_its_lines_are_kept(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    # One serve.log gathers every node (the aggregator tags each line); node1's engine died.
    service, target, _, _ = make(tmp_path, scripted, **ON_FAILURE_2)
    service.step()
    with service.files.serve_log.open("a") as log:
        for n in range(30):
            log.write(f"[node0:engine] head line {n}\n")
            if n % 10 == 0:
                log.write(f"[node1:engine] worker line {n}\n")
        log.write("[sm120] node1:engine killed by SIGKILL\n")
    target.running = False
    target.exit = ExitInfo(returncode=None, signal=9, ended_at=0.0, process="node1:engine")
    service.step()
    assert target.restarts == 1
    assert service.alerts[-1].message == (
        "node1:engine killed by SIGKILL: relaunching the server (watchdog restart 1 of 2)"
    )
    (record,) = service.breaker.state.records
    assert record.reason == "node1:engine killed by SIGKILL"
    assert record.log_tail == [
        "[node1:engine] worker line 0",
        "[node1:engine] worker line 10",
        "[node1:engine] worker line 20",
        "[sm120] node1:engine killed by SIGKILL",
    ]


REAL_SLOW_COMPILE = Path(__file__).parents[1] / "data" / "vllm_logs" / "v0.32.0_cpu_tiny_live.log"
BROADCAST_STALL = (
    "(EngineCore pid=11598) INFO 11-21 00:19:33 [shm_broadcast.py:871] No available shared "
    "memory broadcast block found in 60 seconds. This typically happens when some processes "
    "are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
    "quantization)."
)


def test_a_slow_torch_compile_at_startup_is_no_wedge_alert(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    """A real fresh tiny launch on 2 cores: torch.compile's warm-up ran 2 min and the engine
    core printed the broadcast-stall line (F22's signature) meanwhile. It was alerted as
    "F22 Engine wedged"; the line alone, while the engine starts, is slow work."""
    lines = REAL_SLOW_COMPILE.read_text().splitlines(keepends=True)
    ready_at = next(i for i, line in enumerate(lines) if "Application startup complete" in line)
    assert any("No available shared memory broadcast block" in line for line in lines[:ready_at])
    service, _target, clock, _ = make(tmp_path, scripted)
    scripted.health_status = 503  # the API server is not up while the engine core compiles
    with service.files.serve_log.open("w") as log:
        for line in lines[:ready_at]:
            log.write(line)
            log.flush()
            service.step()
            clock.now += 1
        scripted.health_status = 200
        log.writelines(lines[ready_at:])
    for _ in range(3):
        service.step()
        clock.now += 1
    assert [a.message for a in service.alerts if a.message.startswith("F22")] == []
    assert service.activity == "idle"
    # After start-up the same line, with no compile going on, is reported as before.
    with service.files.serve_log.open("a") as log:
        log.write(BROADCAST_STALL + "\n")
    service.step()
    failures = [a.message for a in service.alerts if a.kind == "failure"]
    assert len(failures) == 1 and failures[0].startswith("F22 Engine wedged (shared-memory")


def test_the_broadcast_line_during_a_compile_after_ready_is_no_alert(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    service, _target, clock, _ = make(tmp_path, scripted)
    service.step()  # ready
    scripted.running = 1.0
    with service.files.serve_log.open("a") as log:
        log.write("(Worker pid=7) INFO [backends.py:1] Compiling a graph for compile range\n")
        log.write(BROADCAST_STALL + "\n")
    clock.now += 1
    service.step()
    assert [a for a in service.alerts if a.kind == "failure"] == []
    assert service.activity == "compiling"
