"""The log parser against real vLLM logs (tests/data/vllm_logs/, sources in SOURCES.md):
exact events per excerpt, the prefilter against the naive path, every catalogue signature."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from sm120.logs.events import Failure, IndexTopkSkip, KvCache, Ready, SpecDecode, Stats
from sm120.logs.logparse import LogParser, clean_line, parse_lines, parse_text
from tests.fakes.engine_logs import REAL_LINES
from tests.helpers import DATA_DIR

CORPUS = DATA_DIR / "vllm_logs"


def stats(**fields: Any) -> dict[str, Any]:
    return {"kind": "stats", **fields}


def v0_stats(prompt: float, gen: float, running: int, waiting: int, kv: float, cpu_kv: float):
    return stats(
        prompt_tps=prompt,
        gen_tps=gen,
        running=running,
        waiting=waiting,
        swapped=0,
        kv_usage_pct=kv,
        cpu_kv_usage_pct=cpu_kv,
    )


def v1_stats(engine: int, prompt: float, gen: float, running: int, waiting: int, kv: float,
             prefix: float) -> dict[str, Any]:  # fmt: skip
    return stats(
        engine=engine,
        prompt_tps=prompt,
        gen_tps=gen,
        running=running,
        waiting=waiting,
        kv_usage_pct=kv,
        prefix_hit_pct=prefix,
    )


def kv(tokens: int, device: str = "GPU") -> dict[str, Any]:
    return {"kind": "kv_cache", "tokens": tokens, "device": device}


def conc(tokens: int, x: float) -> dict[str, Any]:
    return {"kind": "max_concurrency", "tokens_per_request": tokens, "x": x}


def failure(failure_id: str, line: str) -> dict[str, Any]:
    return {"kind": "failure", "id": failure_id, "line": line}


READY = {"kind": "ready"}

# Every value below was read off the excerpt by hand, not copied from the parser's output.
EXPECTED: dict[str, list[dict[str, Any]]] = {
    "v0.3_pending_no_period.log": [v0_stats(0.0, 44.9, 2, 3, 82.1, 0.0)],
    "v0.5_bracket_timestamp.log": [v0_stats(6501.4, 69.1, 4, 0, 15.6, 0.0)],
    "v0.5_prefix_cache_line.log": [
        v0_stats(2876.7, 384.8, 91, 0, 95.2, 0.0),
        {"kind": "prefix_cache", "prefix_hit_pct": 22.16, "cpu_prefix_hit_pct": 0.0},
    ],
    "v0.6.3_speculative_metrics.log": [
        {
            "kind": "spec_decode",
            "acceptance_rate_pct": 64.2,
            "accepted_tokens": 8547,
            "drafted_tokens": 13311,
        },
        {"kind": "prefix_cache", "prefix_hit_pct": 94.35, "cpu_prefix_hit_pct": 0.0},
    ],
    "v0.6_serving.log": [
        v0_stats(0.0, 41.7, 1, 0, 2.0, 0.0),
        v0_stats(0.0, 41.7, 1, 0, 2.1, 0.0),
        v0_stats(0.0, 41.5, 1, 0, 2.1, 0.0),
    ],
    "v0.6_tenstorrent_heartbeat.log": [
        v0_stats(0.0, 16.7, 16, 0, 92.1, 0.0),
        v0_stats(0.0, 16.7, 16, 0, 92.7, 0.0),
    ],
    "v0.6_kv_blocks_concurrency.log": [
        {"kind": "model_loaded", "gib": 14.9888},
        {"kind": "kv_blocks", "gpu_blocks": 1952, "cpu_blocks": 2048},
        conc(20000, 1.56),
        {"kind": "model_loaded", "gib": 14.9888},
        {"kind": "kv_blocks", "gpu_blocks": 1478, "cpu_blocks": 2048},
        conc(29000, 0.82),
    ],
    "v0.7_bulleted_cuda_blocks.log": [
        {"kind": "model_loaded", "gib": 0.9273},
        {"kind": "kv_blocks", "gpu_blocks": 19609, "cpu_blocks": 21845},
    ],
    "v0.7_djl_octal_ansi.log": [],
    "v0.7.3_v1_kv_tokens_first.log": [
        {"kind": "kv_blocks", "gpu_blocks": 127626},
        conc(2048, 997.08),
        kv(2042016),
        conc(2048, 997.08),
    ],
    "v0.8_cpu_prefix_hit.log": [
        v0_stats(0.0, 15.5, 1, 0, 0.0, 0.1),
        {"kind": "prefix_cache", "prefix_hit_pct": 0.0, "cpu_prefix_hit_pct": 90.0},
        v0_stats(0.0, 15.3, 1, 0, 0.0, 0.1),
        {"kind": "prefix_cache", "prefix_hit_pct": 0.0, "cpu_prefix_hit_pct": 90.0},
        v0_stats(0.0, 14.5, 1, 0, 0.0, 0.2),
        {"kind": "prefix_cache", "prefix_hit_pct": 0.0, "cpu_prefix_hit_pct": 90.0},
    ],
    # The wrapped half ("PU KV cache usage: 0.0%.") is lost, the rest is read.
    "v0.8_terminal_wrapped.log": [
        stats(
            prompt_tps=6743.1,
            gen_tps=1278.5,
            running=62,
            waiting=0,
            swapped=0,
            kv_usage_pct=66.7,
        )
    ],
    "v0.8_docker_timestamps_v0_init.log": [{"kind": "engine_init", "seconds": 71.33}],
    "v0.8_v1_specdecoding_2025_04.log": [
        {
            "kind": "spec_decode",
            "acceptance_rate_pct": 100.0,
            "accepted_tokens": 66,
            "drafted_tokens": 66,
        },
        {
            "kind": "spec_decode",
            "acceptance_rate_pct": 100.0,
            "accepted_tokens": 66,
            "drafted_tokens": 66,
        },
        v1_stats(0, 1.1, 10.0, 0, 0, 0.0, 0.0),
    ],
    "v0.9.0_docker_pipe_timestamp.log": [v1_stats(0, 1.1, 315.1, 2, 0, 2.9, 0.0)],
    "v0.9_sm120_startup.log": [
        {"kind": "kv_memory", "gib": 26.91},
        kv(251920),
        conc(40960, 6.15),
        {"kind": "cuda_graphs", "seconds": 14.0, "gib": 0.84},
        {"kind": "engine_init", "seconds": 44.51},
    ],
    "v0.9.1_data_parallel_engine_dead.log": [
        v1_stats(0, 1.9, 10.3, 0, 0, 0.0, 0.0),
        v1_stats(1, 1.5, 10.0, 0, 0, 0.0, 0.0),
    ],
    "v0.9_glued_records.log": [
        v1_stats(0, 0.0, 239.2, 8, 0, 91.2, 0.0),
        v1_stats(0, 0.0, 239.2, 8, 0, 91.6, 0.0),
        v1_stats(0, 0.0, 240.0, 8, 0, 91.9, 0.0),
    ],
    "v0.10_spec_draft_rate_first.log": [
        {
            "kind": "spec_decode",
            "mean_acceptance_length": 5.44,
            "acceptance_rate_pct": 88.8,
            "accepted_tokens": 262,
            "drafted_tokens": 295,
            "accepted_tps": 4.37,
            "drafted_tps": 4.92,
            "per_position_rates": [0.983, 0.949, 0.915, 0.881, 0.712],
        }
    ],
    "v0.10.2_apiserver_spec.log": [
        v1_stats(0, 4234.6, 1152.3, 9, 0, 1.2, 83.9),
        {
            "kind": "spec_decode",
            "mean_acceptance_length": 5.29,
            "acceptance_rate_pct": 53.6,
            "accepted_tokens": 9321,
            "drafted_tokens": 17384,
            "accepted_tps": 932.08,
            "drafted_tps": 1738.36,
            "per_position_rates": [0.902, 0.812, 0.749, 0.682, 0.525, 0.343, 0.195, 0.082],
        },
    ],
    "v0.10.2_ansi_esc_spelled_out.log": [],
    "v0.10.2_ansi_esc_lost_requests.log": [],
    "v0.10_ansi_esc_lost.log": [kv(122880), conc(4096, 30.0)],
    "v0.10_vllmworker_tp_kv.log": [
        {"kind": "kv_memory", "gib": 11.15},
        {"kind": "kv_memory", "gib": 11.15},
        kv(417520),
    ],
    "v0.11_ansi_caret_nested_prefix.log": [],
    "v0.11_enginecore_dp0_kv.log": [
        {"kind": "kv_memory", "gib": 6.51},
        kv(42656),
        conc(32768, 1.3),
    ],
    "v0.11_dp_shm_broadcast_stall.log": [
        v1_stats(0, 0.0, 0.0, 2, 0, 1.7, 0.0),
        v1_stats(1, 0.0, 0.0, 2, 0, 1.7, 0.0),
        failure(
            "F22",
            "(EngineCore_DP0 pid=47415) INFO 10-24 16:26:27 [shm_broadcast.py:466] No available "
            "shared memory broadcast block found in 60 seconds. This typically happens when "
            "some processes are hanging or doing some time-consuming work (e.g. compilation).",
        ),
        failure(
            "F22",
            "(EngineCore_DP0 pid=47415) INFO 10-24 16:27:27 [shm_broadcast.py:466] No available "
            "shared memory broadcast block found in 60 seconds. This typically happens when "
            "some processes are hanging or doing some time-consuming work (e.g. compilation).",
        ),
    ],
    "v0.11_cpu_kv_too_small.log": [
        failure(
            "F08",
            "(EngineCore_DP0 pid=64528) ERROR 11-18 13:44:09 [core.py:842] ValueError: To serve "
            "at least one request with the models's max seq len (40960), (4.38 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (4.00 GiB). Based on "
            "the available memory, the estimated maximum model length is 37376. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine.",
        )
    ],
    "v0.11.0rc2_compose_rocm_startup.log": [
        {"kind": "model_loaded", "gib": 51.7891, "seconds": 29.929735},
        {"kind": "kv_memory", "gib": 109.86},
        kv(205696),
        conc(4096, 50.05),
        {"kind": "cuda_graphs", "seconds": 22.0, "gib": 1.02},
        {"kind": "engine_init", "seconds": 102.52},
        READY,
    ],
    "v0.17_worker_tp_nested_prefix.log": [
        {"kind": "model_loaded", "gib": 26.37, "seconds": 6.007381}
    ],
    "v0.19.1_cpu_image_health.log": [
        v1_stats(0, 2.5, 0.4, 1, 0, 0.5, 38.1),
        v1_stats(0, 0.0, 7.2, 1, 0, 0.5, 38.1),
        v1_stats(0, 0.0, 7.3, 1, 0, 0.6, 38.1),
        v1_stats(0, 0.0, 7.3, 1, 0, 0.6, 38.1),
    ],
    "v1_2026-05_mm_cache_spec.log": [
        v1_stats(0, 0.0, 28.4, 0, 0, 0.0, 0.0),
        {
            "kind": "spec_decode",
            "mean_acceptance_length": 2.2,
            "acceptance_rate_pct": 40.0,
            "accepted_tokens": 78,
            "drafted_tokens": 195,
            "accepted_tps": 15.6,
            "drafted_tps": 38.99,
            "per_position_rates": [0.615, 0.415, 0.169],
        },
        v1_stats(0, 0.0, 0.0, 0, 0, 0.0, 0.0),
    ],
    "v1_2026-05_docker_timestamps.log": [
        v1_stats(0, 6335.3, 4.8, 9, 0, 62.8, 0.0),
        v1_stats(0, 0.0, 7.2, 9, 1, 68.8, 0.0),
        v1_stats(0, 3411.1, 5.7, 10, 0, 74.5, 0.0),
        v1_stats(0, 0.0, 7.2, 10, 0, 79.9, 0.0),
    ],
    "v1_2026-08_mtp_spec_decode.log": [
        v1_stats(0, 0.0, 249.5, 1, 0, 6.5, 0.0),
        {
            "kind": "spec_decode",
            "mean_acceptance_length": 4.0,
            "acceptance_rate_pct": 99.9,
            "accepted_tokens": 1871,
            "drafted_tokens": 1872,
            "accepted_tps": 187.08,
            "drafted_tps": 187.18,
            "per_position_rates": [1.0, 1.0, 0.998],
        },
        v1_stats(0, 0.0, 249.7, 1, 0, 6.8, 0.0),
        {
            "kind": "spec_decode",
            "mean_acceptance_length": 4.0,
            "acceptance_rate_pct": 99.8,
            "accepted_tokens": 1872,
            "drafted_tokens": 1875,
            "accepted_tps": 187.19,
            "drafted_tps": 187.49,
            "per_position_rates": [1.0, 1.0, 0.995],
        },
    ],
    "v0.32.0_cpu_tiny_live.log": [
        # The VLLM_PYTHON warning of that older sm120 is not F17: it is sm120's own variable.
        failure(
            "F22",
            "(EngineCore pid=11598) INFO 11-21 00:09:33 [shm_broadcast.py:871] No available "
            "shared memory broadcast block found in 60 seconds. This typically happens when "
            "some processes are hanging or doing some time-consuming work (e.g. compilation, "
            "weight/kv cache quantization).",
        ),
        kv(1048576, "CPU"),
        conc(1024, 1024.0),
        {"kind": "engine_init", "seconds": 127.03},
        READY,
        v1_stats(0, 2.1, 1.2, 0, 0, 0.0, 0.0),
        v1_stats(0, 0.0, 0.0, 0, 0, 0.0, 0.0),
        v1_stats(0, 4.2, 12.0, 0, 0, 0.0, 0.0),
    ],
    "seed_000_glm47_startup.log": [
        {"kind": "model_loaded", "gib": 47.11, "seconds": 14.96},
        {"kind": "kv_memory", "gib": 31.99},
        kv(729248),
        READY,
    ],
    "seed_000_glm47_errors.log": [
        failure("F01", "    prefill_wrapper.plan(...)"),
        failure(
            "F02",
            "ValueError: Unknown attention backend: 'TRITON'. Valid options are: FLASH_ATTN, "
            "TRITON_ATTN, ...",
        ),
        failure(
            "F03",
            "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy "
            "requests.",
        ),
        failure("F04", "KeyError: 'layers.41.self_attn.qkv_proj.k_scale'"),
    ],
    "seed_003_nvfp4_kv.log": [
        failure("F01", "    prefill_wrapper.plan(...)"),
        failure("F07", "AttributeError: module 'torch' has no attribute 'nvfp4'"),
        failure(
            "F07b",
            "RuntimeError: Error in function 'TllmGenFmhaRunner' at "
            ".../trtllm/fmha/fmhaRunner.cuh:",
        ),
    ],
    "seed_004_dsv4_warning.log": [
        failure(
            "F16", "WARNING sparse_mla_env.py:101 Disabling CUDA graphs for the DeepSeek V4 Triton"
        )
    ],
}


def corpus_text(name: str) -> str:
    return (CORPUS / name).read_text(encoding="utf-8")


def test_every_corpus_file_has_expectations_and_a_source() -> None:
    files = sorted(path.name for path in CORPUS.glob("*.log"))
    assert files == sorted(EXPECTED)
    sources = (CORPUS / "SOURCES.md").read_text(encoding="utf-8")
    for name in files:
        assert f"| {name} |" in sources, f"{name} has no row in SOURCES.md"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_excerpt_gives_exactly_its_events(name: str) -> None:
    events = LogParser().feed_text(corpus_text(name))
    assert [event.as_dict() for event in events] == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_prefilter_finds_what_every_rule_on_every_line_finds(name: str) -> None:
    text = corpus_text(name)
    assert LogParser().feed_text(text) == LogParser(prefilter=False).feed_text(text)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_line_by_line_and_tiny_blocks_give_the_same_events(name: str) -> None:
    text = corpus_text(name)
    whole = LogParser().feed_text(text)
    assert list(parse_lines(text.splitlines(keepends=True))) == whole
    # Blocks far shorter than a line: every line is cut somewhere and must be rejoined.
    assert list(LogParser().parse_stream(io.StringIO(text), block_chars=7)) == whole


def test_contract_examples_round_trip_as_json() -> None:
    event = Stats(
        engine=0,
        prompt_tps=3900.0,
        gen_tps=33.0,
        running=1,
        waiting=0,
        kv_usage_pct=6.5,
        prefix_hit_pct=84.0,
    )
    assert json.dumps(event.as_dict()) == (
        '{"kind": "stats", "engine": 0, "prompt_tps": 3900.0, "gen_tps": 33.0, "running": 1, '
        '"waiting": 0, "kv_usage_pct": 6.5, "prefix_hit_pct": 84.0}'
    )
    spec = SpecDecode(mean_acceptance_length=2.51, acceptance_rate_pct=75.3)
    assert spec.as_dict() == {
        "kind": "spec_decode",
        "mean_acceptance_length": 2.51,
        "acceptance_rate_pct": 75.3,
    }
    assert KvCache(tokens=729248).as_dict() == {"kind": "kv_cache", "tokens": 729248}
    assert Ready().as_dict() == {"kind": "ready"}
    assert Failure(id="F07", line="x").as_dict() == {"kind": "failure", "id": "F07", "line": "x"}


def test_readable_lines() -> None:
    events = parse_text(corpus_text("v1_2026-08_mtp_spec_decode.log"))
    assert events[0].describe() == (
        "stats            engine 0, prompt 0.0 tok/s, gen 249.5 tok/s, running 1, waiting 0, "
        "KV 6.5%, prefix hit 0.0%"
    )
    assert events[1].describe() == (
        "spec_decode      mean acceptance length 4.0, acceptance 99.9%, accepted tokens 1871, "
        "drafted tokens 1872, accepted 187.08 tok/s, drafted 187.18 tok/s, "
        "per position 1/1/0.998"
    )
    startup = parse_text(corpus_text("v0.11.0rc2_compose_rocm_startup.log"))
    assert [event.describe() for event in startup] == [
        "model_loaded     51.7891 GiB, 29.929735 s",
        "kv_memory        109.86 GiB",
        "kv_cache         tokens 205,696, device GPU",
        "max_concurrency  tokens per request 4096, 50.05x",
        "cuda_graphs      22.0 s, 1.02 GiB",
        "engine_init      102.52 s",
        "ready",
    ]


# --- formats no public log showed: built from the format strings in vLLM's source ----------

# vllm/v1/metrics/loggers.py in the vLLM 0.32.0 provisioned here: "Preemptions: %d" appears
# only when preemptions happened, "Deferred" and "KV fetch" only when non-zero.
TODAY = (
    "(APIServer pid=7) INFO 11-21 10:00:00 [loggers.py:335] Engine 001: "
    "Avg prompt throughput: 1200.5 tokens/s, Avg generation throughput: 48.0 tokens/s, "
    "Running: 3 reqs, Waiting: 5 reqs, Deferred: 2 reqs, "
    "KV fetch: 1 waiting to start, 0 in progress, 0 completed waiting, Preemptions: 4, "
    "GPU KV cache usage: 97.5%, Prefix cache hit rate: 12.5%, "
    "External prefix cache hit rate: 80.0%, MM cache hit rate: 3.0%"
)


def test_todays_optional_stats_fields() -> None:
    assert [event.as_dict() for event in parse_text(TODAY)] == [
        stats(
            engine=1,
            prompt_tps=1200.5,
            gen_tps=48.0,
            running=3,
            waiting=5,
            preemptions=4,
            kv_usage_pct=97.5,
            prefix_hit_pct=12.5,
        )
    ]


def test_aggregated_engines_and_the_2025_02_variant() -> None:
    # "{N} Engines Aggregated: " prefix (loggers.py), and the 2025-02-04 format that had no
    # comma before "GPU KV cache usage" and a trailing period.
    aggregated = (
        "INFO 03-01 10:00:00 [loggers.py:200] 2 Engines Aggregated: Avg prompt throughput: "
        "10.0 tokens/s, Avg generation throughput: 20.0 tokens/s, Running: 4 reqs, Waiting: "
        "0 reqs, GPU KV cache usage: 5.0%, Prefix cache hit rate: 1.0%"
    )
    early = (
        "INFO 02-05 10:00:00 [loggers.py:70] Avg prompt throughput: 1.0 tokens/s, Avg "
        "generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs GPU KV cache "
        "usage: 3.1%."
    )
    assert [event.as_dict() for event in parse_text(aggregated + "\n" + early)] == [
        stats(
            engines=2,
            prompt_tps=10.0,
            gen_tps=20.0,
            running=4,
            waiting=0,
            kv_usage_pct=5.0,
            prefix_hit_pct=1.0,
        ),
        stats(prompt_tps=1.0, gen_tps=2.0, running=1, waiting=0, kv_usage_pct=3.1),
    ]


# The b12x fork's line (vllm_facts.md 1.2): logger.info_once("Using index_topk_pattern/
# index_topk_freq to skip sparse MLA indexer computation on layer %s.", layer_id), once per
# skipped layer; and its warning when the pattern is too short (F09's signature).
SKIP = (
    "(EngineCore_DP0 pid=9) INFO 06-19 10:00:0{n} [deepseek_v2.py:1086] Using index_topk_pattern/"
    "index_topk_freq to skip sparse MLA indexer computation on layer {layer}."
)
SHORT = (
    "(EngineCore_DP0 pid=9) WARNING 06-19 10:00:09 [deepseek_v2.py:771] index_topk_pattern is "
    "shorter than num_hidden_layers; not skipping sparse MLA indexer computation on layer 77."
)


def test_index_topk_skip_lines_are_counted_for_f09() -> None:
    lines = [SKIP.format(n=n, layer=layer) for n, layer in enumerate((3, 4, 5))] + [SHORT]
    parser = LogParser()
    events = [event for line in lines for event in parser.feed(line)]
    assert events[:3] == [
        IndexTopkSkip(layer=3, count=1),
        IndexTopkSkip(layer=4, count=2),
        IndexTopkSkip(layer=5, count=3),
    ]
    assert [(event.kind, getattr(event, "id", None)) for event in events[3:]] == [
        ("failure", "F09")
    ]
    assert parser.index_topk_skips == 3  # the "not skipping" warning is not a skip line


# --- prefixes and colour codes --------------------------------------------------------------

BROKEN_COLOUR_PREFIXES = [
    "\x1b[1;36m(APIServer pid=1)\x1b[0;0m ",  # a real escape sequence
    "[1;36m(APIServer pid=3829093)[0;0m ",  # ESC lost (vllm-ascend#3024)
    "ESC[1;36m(APIServer pid=1)ESC[0;0m ",  # spelled out (vllm#22793)
    "^[[1;36m(APIServer pid=1)^[[0;0m ^[[1;36m(EngineCore_DP0 pid=276)^[[0;0m ",  # vllm#25623
    "#033[1;36m(VllmWorkerProcess pid=240)#033[0;0m ",  # DJL's octal form
    "[0;36m(APIServer pid=556855)[0;0m ",
]
PREFIXES = [
    *BROKEN_COLOUR_PREFIXES,
    "vllm-1  | (APIServer pid=8) ",  # docker compose
    "2026-05-12T08:01:39.331095044Z (APIServer pid=1) ",  # docker --timestamps
    "Aug 19 13:18:22 sys0 vllm[76674]: (Worker_TP0 pid=76674) ",  # journald
    "(Worker pid=190480) (Worker_TP0 pid=190480) ",
    "(EngineCore_DP1 pid=235461) ",
    "(VllmWorker TP0 pid=1545) ",
]
MESSAGE = (
    "INFO 05-19 10:13:11 [loggers.py:271] Engine 000: Avg prompt throughput: 12068.8 tokens/s, "
    "Avg generation throughput: 734.9 tokens/s, Running: 18 reqs, Waiting: 33 reqs, "
    "GPU KV cache usage: 87.7%, Prefix cache hit rate: 0.0%"
)  # vllm#43295


@pytest.mark.parametrize("prefix", PREFIXES)
def test_any_prefix_in_front_of_a_real_stats_line(prefix: str) -> None:
    assert [event.as_dict() for event in parse_text(prefix + MESSAGE)] == [
        v1_stats(0, 12068.8, 734.9, 18, 33, 87.7, 0.0)
    ]


@pytest.mark.parametrize("prefix", BROKEN_COLOUR_PREFIXES)
def test_colour_codes_are_removed_from_failure_lines(prefix: str) -> None:
    line = (
        "ERROR 11-18 13:44:09 [core.py:842] AttributeError: module 'torch' has no attribute 'nvfp4'"
    )
    (event,) = parse_text(prefix + line + "\r\n")
    assert isinstance(event, Failure) and event.id == "F07"
    assert "[1;36m" not in event.line and "[0;0m" not in event.line
    assert event.line.endswith(line)


def test_clean_line_keeps_brackets_that_are_not_colour_codes() -> None:
    text = "[2024-07-08 15:17:34] INFO 07-08 07:17:34 [metrics.py:334] shape [16, 2] ok\r\n"
    assert clean_line(text) == text.rstrip("\r\n")


# --- failures: every signature of the catalogue, through the prefilter ----------------------


@pytest.mark.parametrize(
    ("failure_id", "line"),
    [(failure_id, line) for failure_id, lines in REAL_LINES.items() for line in lines],
)
def test_every_catalogue_signature_is_found_through_the_prefilter(
    failure_id: str, line: str
) -> None:
    found = [event.as_dict() for event in parse_text("INFO some line before\n" + line + "\n")]
    assert found == [failure(failure_id, line)]


def test_failures_are_limited_to_their_gpu_when_it_is_known() -> None:
    line = "    prefill_wrapper.plan(...)"  # F01 is SM120/SM121 only
    assert [event.as_dict()["id"] for event in LogParser(sm=120).feed(line)] == ["F01"]
    assert LogParser(sm=90).feed(line) == []


def test_a_signature_without_a_literal_still_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """A case-insensitive signature has no literal to prefilter on: every line is checked."""
    import sm120.logs.failures
    from sm120.logs import logparse
    from sm120.logs.failures import FailureMode

    mode = FailureMode(
        id="F99",
        title="t",
        cause="c",
        fix="f",
        handle=("diagnose",),
        sources=("test",),
        signatures=("(?i)engine stalled",),
    )
    monkeypatch.setattr(sm120.logs.failures, "load_catalogue", lambda: {"F99": mode})
    logparse._rule_set.cache_clear()
    try:
        parser = LogParser()
        assert parser.feed("WARNING ENGINE STALLED again") == [
            Failure(id="F99", line="WARNING ENGINE STALLED again")
        ]
    finally:
        logparse._rule_set.cache_clear()


def test_a_line_never_gives_the_same_failure_twice() -> None:
    # Both F08 signatures match this line.
    line = REAL_LINES["F08"][0]
    assert [event.as_dict()["id"] for event in parse_text(line)] == ["F08"]


def test_counts_lines_including_a_last_one_without_newline() -> None:
    parser = LogParser()
    parser.feed_text("a\nb\n")
    parser.feed_text("c")
    assert parser.lines == 3


def test_the_common_stats_shortcut_agrees_with_reading_field_by_field() -> None:
    from sm120.logs import logparse

    checked = 0
    for path in sorted(CORPUS.glob("*.log")):
        for line in path.read_text(encoding="utf-8").splitlines():
            start = line.find("Avg prompt throughput: ")
            if start < 0 or logparse._STATS_COMMON.match(line[start:]) is None:
                continue
            record = line[start:]
            assert logparse._stats_record("", record) == logparse._stats_fields(record, None, None)
            checked += 1
    assert checked >= 20  # the V1 lines of the corpus; V0 and glued lines take the long way


def test_windows_line_endings() -> None:
    events = parse_text(MESSAGE + "\r\n" + PREFIXES[0] + MESSAGE + "\r\n")
    assert [event.as_dict() for event in events] == [
        v1_stats(0, 12068.8, 734.9, 18, 33, 87.7, 0.0)
    ] * 2
