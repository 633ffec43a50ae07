"""The long-running monitor: follows serve.log, scrapes /metrics, keeps peaks and history,
runs the watchdog, and publishes what it sees in monitor/live.json.

One poll (`step`) reads the new log lines, asks the runtime whether the server runs, checks
/health, scrapes /metrics, folds the rates into peaks and history, and lets the watchdog
judge. Alerts (server died, /health 503, restart loop, wedge, gave up, catalogue failures)
go to logs/events.jsonl, to the monitor's own log, and into live.json.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from sm120.core.errors import SM120Error
from sm120.engine.gpu_readings import GpuReading, GpuSource, default_source
from sm120.engine.log_follow import LogFollower
from sm120.engine.runtime.base import ExitInfo
from sm120.logs.diagnosis.naming import STARTUP_WORK
from sm120.logs.failures import Diagnoser
from sm120.logs.phases import StartupTracker
from sm120.monitor.diagnostics import capture_wedge
from sm120.monitor.files import MonitorFiles, MonitorSettings
from sm120.monitor.gpu_activity import describe_gpus
from sm120.monitor.kv_tier import tier_view
from sm120.monitor.metrics import (
    MetricsError,
    MetricsSnapshot,
    Rates,
    fetch_metrics_text,
    parse_metrics,
    rates_between,
)
from sm120.monitor.peaks import JsonlRing, PeakTracker, iso_time, read_json, write_json_atomically
from sm120.monitor.watchdog import (
    RESTARTABLE,
    Activity,
    RestartBreaker,
    WedgeDetector,
    breaker_state_from,
)
from sm120.monitor.watched import Target
from sm120.recipe.restart_policy import is_failure

RECENT_LINES = 200
LIVE_ALERTS = 20
EVENTS_CAP = 2000
# Starts (first one excluded) within this window that count as a restart loop.
RESTART_LOOP_STARTS = 3
RESTART_LOOP_WINDOW_S = 900.0
# Older output than this is history: start reading a big serve.log at its end.
START_AT_END_BYTES = 8 * 1024 * 1024
HTTP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Alert:
    at: float
    kind: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"at": iso_time(self.at), "kind": self.kind, "message": self.message}


def load_breaker(files: MonitorFiles, settings: MonitorSettings) -> RestartBreaker:
    return RestartBreaker(
        settings.max_restarts,
        settings.restart_window_s,
        breaker_state_from(read_json(files.watchdog)),
        settings.restart_backoff_s,
    )


class MonitorService:
    def __init__(
        self,
        target: Target,
        files: MonitorFiles,
        settings: MonitorSettings,
        *,
        clock: Callable[[], float] = time.time,
        say: Callable[[str], None] | None = None,
        gpu_source: GpuSource | None = None,
    ) -> None:
        files.make_dirs()
        self.target = target
        self.files = files
        self.settings = settings
        self.clock = clock
        self.say = say or _to_stderr
        big = files.serve_log.is_file() and files.serve_log.stat().st_size > START_AT_END_BYTES
        self.follower = LogFollower(files.serve_log, at_end=big)
        self.recent: deque[str] = deque(maxlen=RECENT_LINES)
        self.tracker = StartupTracker()
        self.diagnoser = Diagnoser()
        self.detector = WedgeDetector(settings.wedge_timeout_s, livelock_s=settings.livelock_s)
        self.gpu_source = gpu_source if gpu_source is not None else default_source()
        self.gpus: list[GpuReading] = []
        self.breaker = load_breaker(files, settings)
        self.peaks = PeakTracker(files.peak, image=settings.image, plan_hash=settings.plan_hash)
        self.history = JsonlRing(files.history, settings.history_cap)
        self.events = JsonlRing(files.events, EVENTS_CAP)
        self.alerts: deque[Alert] = deque(maxlen=LIVE_ALERTS)
        self.snapshot: MetricsSnapshot | None = None
        self.rates: Rates | None = None
        self.metrics_text: str | None = None
        self.health: int | None = None
        self.activity = "starting"
        self.identity: str | None = None
        self.server_started_at: float | None = None
        self.starts: deque[float] = deque()
        self.dead_since: float | None = None
        self.exit_text: str | None = None
        self.finished = False
        self.last_wedge: str | None = None
        self.restarted_at: float | None = None
        self._episodes: set[str] = set()
        self._http: httpx.Client | None = None

    # --- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        last_failure = ""
        while not stop.is_set() and not self.finished:
            began = time.monotonic()
            try:
                if self.target.gone():
                    self.say("the deployment was stopped or replaced; the monitor ends")
                    break
                self.step()
            except Exception:  # one bad poll must not end the watch
                failure = traceback.format_exc()
                if failure != last_failure:  # a repeating failure is logged once
                    self.say("poll failed:\n" + failure)
                last_failure = failure
            stop.wait(max(0.0, self.settings.poll_s - (time.monotonic() - began)))
        self.publish(stopped=True)
        self.close()

    def close(self) -> None:
        self.follower.close()
        if self._http is not None:
            self._http.close()

    def step(self) -> None:
        now = self.clock()
        for line in self.follower.read_lines():
            self._take_line(line, now)
        self.gpus = self.gpu_source.read()
        server = self.target.server()
        self._note_identity(server.identity, now)
        if server.running:
            self.dead_since = None
            for episode in ("died", "backoff", "clean_exit"):
                self._end_episode(episode)
            self._poll_server(now)
        else:
            self._server_down(server.exit.describe() if server.exit else None, now)
            owned = server.identity is not None
            if not (owned and self._relaunch_after_death(server.exit, now)):
                self._dead_for_good(owned, now)
        self.publish()

    @property
    def ready(self) -> bool:
        return self.health == 200

    # --- log lines -----------------------------------------------------------------------

    def _take_line(self, line: str, now: float) -> None:
        self.recent.append(line)
        if self.ready:
            self.detector.note_line(line, now)
            busy_compiling = self.detector.compiling(now)
        else:
            self.tracker.feed(line, now)
            busy_compiling = self.tracker.phase in STARTUP_WORK
        # The shared-memory broadcast line (F22) also says "a worker has been busy 60 s":
        # while the engine loads, compiles or warms up (a fresh tiny launch's torch.compile
        # took 2 min on 2 cores) that is slow work, not a wedge, as `sm120 logs` already
        # judges it (name_failures). The watchdog names a real wedge from frozen counters.
        for found in self.diagnoser.feed(line, starting=busy_compiling):
            self._alert(now, "failure", f"{found.id} {found.title}. Fix: {found.fix}")

    # --- the server ----------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        if self._http is None or str(self._http.base_url).rstrip("/") != self.target.base_url:
            if self._http is not None:
                self._http.close()
            key = self.target.api_key()
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            # No keep-alive: a connection left open when the server dies holds its port
            # (the server side lingers in TIME_WAIT), and a restart or relaunch on the same
            # port would then find it taken. Closing after each request leaves the wait on
            # our side.
            self._http = httpx.Client(
                base_url=self.target.base_url,
                headers=headers,
                timeout=HTTP_TIMEOUT_S,
                limits=httpx.Limits(max_keepalive_connections=0),
            )
        return self._http

    def _poll_server(self, now: float) -> None:
        client = self._client()
        try:
            self.health = client.get("/health").status_code
        except httpx.HTTPError:
            self.health = None
        if self.health == 503:
            self._alert_once(
                "health", now, "/health answers 503: the engine died or is failing (see the log)"
            )
        elif self.health == 200:
            self._end_episode("health")
            self.restarted_at = None
            if not self.tracker.is_ready:
                # /health is the authority (the log may be elsewhere, e.g. a compose service).
                self.tracker.feed("Application startup complete.", now)
        if self.health != 200 and self.restarted_at is not None:
            waited = now - self.restarted_at
            if waited > self.settings.ready_timeout_s:
                self._alert_once(
                    "not_ready", now, f"the restarted server is not ready after {waited:.0f} s"
                )
        if self.health is None:
            self.activity = "starting" if not self.tracker.is_ready else "not answering"
            return
        try:
            text = fetch_metrics_text(client)
            snapshot = parse_metrics(text, at=now)
        except MetricsError:
            return
        self._take_snapshot(snapshot, text, now)

    def _take_snapshot(self, snapshot: MetricsSnapshot, text: str, now: float) -> None:
        if snapshot.started_at is not None:
            if self.server_started_at is not None and snapshot.started_at != self.server_started_at:
                self._note_start(now)
            self.server_started_at = snapshot.started_at
        previous, self.snapshot, self.metrics_text = self.snapshot, snapshot, text
        self.rates = rates_between(previous, snapshot) if previous else None
        # Right after a restart the deltas span the whole restart: no peak from those.
        usable = self.rates if self.rates and not self.rates.restarted else None
        self.peaks.observe(
            prefill_tps=usable.prefill_tps if usable else None,
            decode_tps=usable.decode_tps if usable else None,
            running=snapshot.running,
            at=now,
        )
        if self.ready:
            activity = self.detector.observe(snapshot, now, self.gpus)
            self.activity = activity.value
            if activity in RESTARTABLE:
                self._on_wedge(now, activity)
            else:
                self._end_episode("wedge")
        else:
            self.activity = "starting"
        self.history.append(self._sample(now))

    def _sample(self, now: float) -> dict[str, Any]:
        snapshot, rates = self.snapshot, self.rates
        return {
            "t": round(now, 3),
            "prefill_tps": _round(rates.prefill_tps if rates else None),
            "decode_tps": _round(rates.decode_tps if rates else None),
            "running": snapshot.running if snapshot else None,
            "waiting": snapshot.waiting if snapshot else None,
            "kv_usage": snapshot.kv_usage if snapshot else None,
            "acceptance_rate": _round(rates.acceptance_rate if rates else None, 4),
            "activity": self.activity,
            "gpus": [gpu.as_dict() for gpu in self.gpus],
        }

    def _server_down(self, exit_text: str | None, now: float) -> None:
        self.activity = "dead"
        self.health = None
        self.exit_text = exit_text
        if self.dead_since is None:
            self.dead_since = now
        self._alert_once("died", now, f"the server {exit_text or 'is not answering'}")

    def _dead_for_good(self, owned: bool, now: float) -> None:
        # A deployment's dead server stays dead unless its runtime brings it back in time.
        down_for = 0.0 if self.dead_since is None else now - self.dead_since
        if owned and down_for >= self.settings.dead_grace_s:
            self.say("the server stayed down; the monitor ends")
            self.finished = True

    def _note_identity(self, identity: str | None, now: float) -> None:
        if identity is None:
            return
        if self.identity is not None and identity != self.identity:
            self._new_run(now)
            self._note_start(now)
        self.identity = identity

    def _note_start(self, now: float) -> None:
        self.starts.append(now)
        while self.starts and now - self.starts[0] > RESTART_LOOP_WINDOW_S:
            self.starts.popleft()
        if len(self.starts) >= RESTART_LOOP_STARTS:
            minutes = RESTART_LOOP_WINDOW_S / 60
            self._alert_once(
                "restart_loop",
                now,
                f"restart loop: the server started {len(self.starts)} times in "
                f"{minutes:.0f} min (F26)",
            )
        else:
            self._end_episode("restart_loop")

    def _new_run(self, now: float) -> None:
        """A new server process: startup and progress start over."""
        self.tracker = StartupTracker()
        self.diagnoser = Diagnoser()
        self.detector.reset(now)
        self.snapshot = None
        self.rates = None
        self.health = None
        self.server_started_at = None
        self._end_episode("wedge")

    # --- the watchdog --------------------------------------------------------------------

    def _on_wedge(self, now: float, activity: Activity = Activity.wedged) -> None:
        if "wedge" in self._episodes:
            return  # this wedge was handled already (reported, not restarted)
        self._episodes.add("wedge")
        frozen = self.detector.frozen_for(now)
        running = int(self.snapshot.running or 0) if self.snapshot else 0
        livelock = activity is Activity.livelock
        capture = capture_wedge(
            self.files.diagnostics,
            summary={
                "at": iso_time(now),
                "frozen_for_s": round(frozen, 1),
                "wedge_timeout_s": self.settings.wedge_timeout_s,
                "running": running,
                "counters": self.snapshot.counters if self.snapshot else {},
                "verdict": activity.value,
                "gpus": [gpu.as_dict() for gpu in self.gpus],
            },
            log_tail=list(self.recent),
            metrics_text=self.metrics_text,
            pids=self.target.engine_pids(),
            at=now,
        )
        self.last_wedge = str(capture)
        if livelock:
            self._alert(
                now,
                "livelock",
                f"livelock: {running} request(s) running and token counters frozen for "
                f"{frozen:.0f} s while the GPUs stay busy ({describe_gpus(self.gpus)}); "
                f"diagnostics in {capture}",
            )
        else:
            self._alert(
                now,
                "wedge",
                f"wedged (F22): {running} request(s) running and token counters frozen for "
                f"{frozen:.0f} s; diagnostics in {capture}",
            )
        self._maybe_restart(now, "after a livelock " if livelock else "")

    def _maybe_restart(self, now: float, why: str = "") -> None:
        if not self.settings.restart_on_wedge:
            self._alert(
                now, "wedge", "not restarting: the recipe's monitor.restart_on_wedge is off"
            )
            return
        if not self.target.can_restart():
            self._alert(now, "wedge", "not restarting: this monitor cannot restart the server")
            return
        if not self.breaker.allows(now):
            self._give_up(now, f"{self._restarts_so_far(now)}; not restarting again (F26)")
            return
        kind = Activity.livelock.value if why else Activity.wedged.value
        frozen = self.detector.frozen_for(now)
        reason = f"{kind}: token counters frozen for {frozen:.0f} s with requests running"
        self._restart(now, kind, reason, f"restarting the server {why}")

    def _relaunch_after_death(self, exit_info: ExitInfo | None, now: float) -> bool:
        """`--restart on-failure`: True while the policy handles this death (relaunched it,
        waits out the backoff, or gave up and stopped what was left of it)."""
        if not self.settings.restart_on_death or not self.target.can_restart():
            return False
        if exit_info is not None and not is_failure(exit_info.returncode, exit_info.signal):
            self._alert_once(
                "clean_exit",
                now,
                f"not relaunching: the engine {exit_info.describe()}, which is a stop, not a "
                f"failure (restart policy {self.settings.restart_policy})",
            )
            return False
        how = exit_info.describe() if exit_info else "went away (exit status unknown)"
        # Several processes make one deployment (nodes): name the one that ended.
        process = exit_info.process if exit_info else None
        server = process or "the server"
        if not self.breaker.allows(now):
            self._give_up(
                now,
                f"{server} {how} after {self._restarts_so_far(now)}; not relaunching again (F26)",
            )
            self._stop_for_good(now)
            return True
        wait = self.breaker.wait_s(now)
        if wait > 0:
            self._alert_once("backoff", now, f"{server} {how}; relaunching in {wait:.0f} s")
            return True
        # Its last words reach the log before its exit is recorded: read them all first.
        for line in self.follower.read_lines():
            self._take_line(line, now)
        reason = f"{process} {how}" if process else f"the engine {how}"
        self._restart(
            now, "died", reason, f"{reason}: relaunching the server ", self._tail_of(process)
        )
        return True

    def _tail_of(self, process: str | None) -> list[str]:
        """The last lines of the process that ended. Where one log gathers several (a
        multi-node deployment tags each line `[node1:engine] ...`), only that one's lines and
        what sm120 noted about it: the healthy nodes' lines would bury them."""
        recent = list(self.recent)
        if process is None:
            return recent
        own = [
            line
            for line in recent
            if line.startswith(f"[{process}] ") or line.startswith(f"[sm120] {process} ")
        ]
        return own or recent

    def _restarts_so_far(self, now: float) -> str:
        hours = self.breaker.window_s / 3600
        return (
            f"{len(self.breaker.recent(now))} watchdog restarts in the last {hours:g} h "
            f"(limit {self.breaker.limit})"
        )

    def _give_up(self, now: float, reason: str) -> None:
        if not self.breaker.gave_up:
            self.breaker.give_up(now, reason)
            self._save_breaker()
        self._alert(now, "gave_up", f"gave up: {reason}")

    def _stop_for_good(self, now: float) -> None:
        try:
            self.target.stop_server(self.settings.stop_timeout_s)
        except SM120Error as exc:
            self._alert(now, "stop_failed", f"stopping the dead server failed: {exc.one_line()}")
        self.say("the breaker is open: the server stays stopped and the monitor ends")
        self.finished = True

    def _restart(
        self,
        now: float,
        kind: str,
        reason: str,
        announce: str,
        log_tail: list[str] | None = None,
    ) -> None:
        tail = list(self.recent) if log_tail is None else log_tail
        self.breaker.record_restart(now, kind, reason, tail)
        self._save_breaker()
        count, limit = len(self.breaker.recent(now)), self.breaker.limit
        self._alert(now, "restart", f"{announce}(watchdog restart {count} of {limit})")
        try:
            self.target.restart(self.settings.stop_timeout_s)
        except SM120Error as exc:
            self._alert(self.clock(), "restart_failed", f"restart failed: {exc.one_line()}")
            return
        after = self.clock()
        self._new_run(after)
        self.restarted_at = after
        self.dead_since = None
        for episode in ("died", "backoff"):
            self._end_episode(episode)
        self.identity = self.target.server().identity
        self._note_start(after)

    def _save_breaker(self) -> None:
        write_json_atomically(self.files.watchdog, asdict(self.breaker.state))

    # --- alerts and the published view ---------------------------------------------------

    def _alert(self, now: float, kind: str, message: str) -> None:
        alert = Alert(now, kind, message)
        self.alerts.append(alert)
        self.events.append(alert.as_dict())
        self.say(f"{iso_time(now)} {kind}: {message}")

    def _alert_once(self, kind: str, now: float, message: str) -> None:
        """Alert when a condition starts, not on every poll while it lasts."""
        if kind not in self._episodes:
            self._episodes.add(kind)
            self._alert(now, kind, message)

    def _end_episode(self, kind: str) -> None:
        self._episodes.discard(kind)

    def live(self, *, stopped: bool = False) -> dict[str, Any]:
        snapshot, rates, peaks = self.snapshot, self.rates, self.peaks.peaks
        now = self.clock()
        return {
            "updated": iso_time(now),
            "updated_at": now,
            "monitor_running": not stopped,
            "phase": self.tracker.phase.value,
            "phase_detail": self.tracker.detail,
            "activity": self.activity,
            "health": self.health,
            "exit": self.exit_text if self.activity == "dead" else None,
            "running": snapshot.running if snapshot else None,
            "waiting": snapshot.waiting if snapshot else None,
            "kv_usage_pct": _round(snapshot.kv_usage * 100, 1)
            if snapshot and snapshot.kv_usage is not None
            else None,
            "prefill_tps": _round(rates.prefill_tps if rates else None),
            "decode_tps": _round(rates.decode_tps if rates else None),
            "acceptance_rate": _round(rates.acceptance_rate if rates else None, 4),
            "mean_acceptance_length": _round(rates.mean_acceptance_length if rates else None),
            "prefix_hit_rate": _round(prefix_hit_rate(rates.deltas if rates else {}), 4),
            "prefix_hit_rate_total": _round(
                prefix_hit_rate(snapshot.counters if snapshot else {}), 4
            ),
            "speculative": {
                "method": self.settings.speculative_method,
                "num_speculative_tokens": self.settings.speculative_tokens,
            }
            if self.settings.speculative_method
            else None,
            "peaks": asdict(peaks),
            "watchdog": {
                "frozen_for_s": round(self.detector.frozen_for(now), 1),
                "wedge_timeout_s": self.settings.wedge_timeout_s,
                "gpus_busy_for_s": round(self.detector.busy_for(now), 1),
                "livelock_s": self.settings.livelock_s,
                "restart_on_wedge": self.settings.restart_on_wedge,
                "restart_policy": self.settings.restart_policy,
                "breaker": self.breaker.position,
                "restarts_in_window": len(self.breaker.recent(now)),
                "max_restarts": self.breaker.limit,
                "window_h": self.breaker.window_s / 3600,
                "gave_up": self.breaker.gave_up,
                "gave_up_reason": self.breaker.state.gave_up_reason,
                "last_wedge": self.last_wedge,
            },
            "alerts": [alert.as_dict() for alert in self.alerts],
            "gpus": [gpu.as_dict() for gpu in self.gpus],
            "kv_tier": tier_view(snapshot.counters) if snapshot else None,
        }

    def publish(self, *, stopped: bool = False) -> None:
        write_json_atomically(self.files.live, self.live(stopped=stopped), durable=False)


def prefix_hit_rate(counters: dict[str, float]) -> float | None:
    """Prompt tokens the prefix cache served per token looked up (0-1); None without lookups.
    Over an interval's deltas: what the cache does now; over the counters: since start."""
    queried = counters.get("prefix_queries")
    if not queried:
        return None
    return counters.get("prefix_hits", 0.0) / queried


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _to_stderr(text: str) -> None:
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()
