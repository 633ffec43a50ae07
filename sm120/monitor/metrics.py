"""vLLM's /metrics: token counters, queue gauges, KV usage and speculative decoding, and the
rates between two scrapes.

The rates come from counter deltas, so they keep working when the periodic log line goes
quiet at idle. Counters start again from zero when the server restarts; a restart is told
by the process start time (or a counter going down), and the interval then counts what
the new server did since it started, as Prometheus' rate() does.

Names moved between vLLM releases: KV usage is `vllm:kv_cache_usage_perc` today and was
`vllm:gpu_cache_usage_perc` (removed late 2025); the prefix-cache counters lost their
`gpu_` prefix. Every engine of a data-parallel server reports its own series (label
`engine`): counters and queue gauges are summed, KV usage is averaged.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sm120.core.errors import SM120Error
from sm120.server.transport import BadServerResponse, bounded_request

METRICS_PATH = "/metrics"

# Sample name -> field. Counters are read from their `_total` samples.
COUNTERS = {
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    # Engine steps, prefill chunks included: moves even while a long prompt is prefilled.
    "vllm:iteration_tokens_total_count": "iterations",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:spec_decode_num_drafts_total": "spec_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "spec_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "spec_accepted_tokens",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:gpu_prefix_cache_queries_total": "prefix_queries",
    "vllm:gpu_prefix_cache_hits_total": "prefix_hits",
    # The KV tier (monitor/kv_tier.py): hits the KV connector served, bytes it moved.
    "vllm:external_prefix_cache_queries_total": "tier_queries",
    "vllm:external_prefix_cache_hits_total": "tier_hits",
    "vllm:kv_offload_store_bytes_total": "tier_store_bytes",
    "vllm:kv_offload_load_bytes_total": "tier_load_bytes",
    "lmcache:num_requested_tokens_total": "lmcache_requested_tokens",
    "lmcache:num_hit_tokens_total": "lmcache_hit_tokens",
}
# Before vLLM 0.30 (and beside the new names for a while) one counter labelled by direction;
# read only where the new store / load counters are absent, so nothing counts twice.
LEGACY_OFFLOAD_BYTES = "vllm:kv_offload_total_bytes_total"
LEGACY_DIRECTIONS = {"gpu_to_cpu": "tier_store_bytes", "cpu_to_gpu": "tier_load_bytes"}
SUMMED_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}
# Newest name first: a release exposing both reports the same value under each.
KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
START_TIME = "process_start_time_seconds"
WANTED = frozenset([*COUNTERS, *SUMMED_GAUGES, *KV_USAGE_NAMES, START_TIME, LEGACY_OFFLOAD_BYTES])


class MetricsError(SM120Error):
    """/metrics could not be read."""


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape. `at` is wall time (for history), `mono` a monotonic clock (for rates)."""

    at: float
    mono: float
    counters: dict[str, float] = field(default_factory=dict)
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    """A 0-1 fraction."""
    started_at: float | None = None
    """The server process's start time: a new value means the counters started over."""

    def counter(self, name: str) -> float | None:
        return self.counters.get(name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "counters": dict(self.counters),
            "running": self.running,
            "waiting": self.waiting,
            "kv_usage": self.kv_usage,
            "started_at": self.started_at,
        }


def _metric_name(line: str) -> str:
    return line.split("{", 1)[0].split(" ", 1)[0]


def parse_metrics(
    text: str, *, at: float | None = None, mono: float | None = None
) -> MetricsSnapshot:
    """Read the samples sm120 uses from Prometheus text exposition format."""
    # Only the wanted samples go to the parser: a vLLM page is ~50 KB of histograms, and
    # the watchdog scrapes it every few seconds for as long as the server runs.
    wanted = "\n".join(
        line
        for line in text.splitlines()
        if line and line[0] != "#" and _metric_name(line) in WANTED
    )
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    kv: dict[str, list[float]] = {}
    legacy: dict[str, float] = {}
    started_at = None
    try:
        families = list(text_string_to_metric_families(wanted + "\n"))
    except ValueError as exc:
        raise MetricsError(f"/metrics is not Prometheus text ({exc})") from None
    for family in families:
        for sample in family.samples:
            name, value = sample.name, float(sample.value)
            if not math.isfinite(value):
                continue  # NaN or ±Inf: no reading (rates, percentages and int() break on it)
            if name in COUNTERS:
                key = COUNTERS[name]
                counters[key] = counters.get(key, 0.0) + value
            elif name in SUMMED_GAUGES:
                key = SUMMED_GAUGES[name]
                gauges[key] = gauges.get(key, 0.0) + value
            elif name in KV_USAGE_NAMES:
                kv.setdefault(name, []).append(value)
            elif name == START_TIME:
                started_at = value
            elif name == LEGACY_OFFLOAD_BYTES:
                direction = sample.labels.get("transfer_type", "").lower()
                if direction in LEGACY_DIRECTIONS:
                    key = LEGACY_DIRECTIONS[direction]
                    legacy[key] = legacy.get(key, 0.0) + value
    for key, value in legacy.items():
        counters.setdefault(key, value)
    kv_usage = next((sum(v) / len(v) for n in KV_USAGE_NAMES if (v := kv.get(n))), None)
    return MetricsSnapshot(
        at=time.time() if at is None else at,
        mono=time.monotonic() if mono is None else mono,
        counters=counters,
        running=gauges.get("running"),
        waiting=gauges.get("waiting"),
        kv_usage=kv_usage,
        started_at=started_at,
    )


def fetch_metrics_text(client: httpx.Client) -> str:
    """GET /metrics through a client that already carries the base URL and API key."""
    try:
        response = bounded_request(client, "GET", METRICS_PATH)
    except httpx.HTTPError as exc:
        raise MetricsError(f"/metrics did not answer ({type(exc).__name__})") from None
    except BadServerResponse as exc:
        raise MetricsError(exc.message) from None
    if response.status_code != 200:
        raise MetricsError(f"/metrics answered HTTP {response.status_code}")
    return response.text


def scrape(client: httpx.Client) -> MetricsSnapshot:
    return parse_metrics(fetch_metrics_text(client))


@dataclass(frozen=True)
class Rates:
    """What happened between two scrapes."""

    seconds: float
    prefill_tps: float | None
    decode_tps: float | None
    deltas: dict[str, float]
    restarted: bool
    """The server started over in between: deltas count from its start."""
    acceptance_rate: float | None = None
    """Accepted / drafted speculative tokens in the interval (0-1)."""
    mean_acceptance_length: float | None = None
    """1 + accepted / drafts: tokens produced per verification step, bonus token included."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "prefill_tps": self.prefill_tps,
            "decode_tps": self.decode_tps,
            "restarted": self.restarted,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
        }


def counter_delta(before: float | None, after: float | None, restarted: bool) -> float | None:
    """How much a counter grew; after a restart (or when it went down) it grew from zero."""
    if after is None:
        return None
    if before is None:
        return None if not restarted else after
    if restarted or after < before:
        return after
    return after - before


def rates_between(before: MetricsSnapshot, after: MetricsSnapshot) -> Rates | None:
    seconds = after.mono - before.mono
    if seconds <= 0:
        return None
    restarted = (
        before.started_at is not None
        and after.started_at is not None
        and after.started_at != before.started_at
    ) or any(
        value < before.counters[name]
        for name, value in after.counters.items()
        if name in before.counters
    )
    deltas: dict[str, float] = {}
    for name, current in after.counters.items():
        delta = counter_delta(before.counter(name), current, restarted)
        if delta is not None:
            deltas[name] = delta
    rates = Rates(
        seconds=seconds,
        prefill_tps=_per_second(deltas.get("prompt_tokens"), seconds),
        decode_tps=_per_second(deltas.get("generation_tokens"), seconds),
        deltas=deltas,
        restarted=restarted,
    )
    return _with_acceptance(rates)


def _per_second(delta: float | None, seconds: float) -> float | None:
    return None if delta is None else delta / seconds


def _with_acceptance(rates: Rates) -> Rates:
    accepted = rates.deltas.get("spec_accepted_tokens")
    drafted = rates.deltas.get("spec_draft_tokens")
    drafts = rates.deltas.get("spec_drafts")
    if accepted is None:
        return rates
    return replace(
        rates,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_acceptance_length=1.0 + accepted / drafts if drafts else None,
    )


def progress_counters(snapshot: MetricsSnapshot) -> tuple[float | None, ...]:
    """The counters that move whenever the engine does work: frozen means no progress."""
    return tuple(
        snapshot.counter(name) for name in ("generation_tokens", "prompt_tokens", "iterations")
    )
