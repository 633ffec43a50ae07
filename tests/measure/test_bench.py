"""`sm120 bench`: steps capped by the plan, our load generator against scripted speeds,
/metrics acceptance, history and regression verdicts, `vllm bench serve` plumbing."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import re
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sm120.engine.state import DeploymentState, save_state
from sm120.measure import bench, history, metrics
from sm120.measure.bench import BenchError, BenchOptions, plan_steps, run_bench
from sm120.measure.load import TokenPool, run_load
from sm120.measure.present import show_bench
from sm120.measure.reference import decode_against
from sm120.measure.target import Target, save_plan, target_for_url
from sm120.measure.vllm_bench import (
    SHIM,
    BenchToolError,
    ContainerExec,
    NativeExec,
    ServeRun,
    command_for,
    engine_exec_for,
    parse_serve_result,
    serve_args,
)
from tests.fakes.openai_server import FakeOpenAIServer
from tests.helpers import DATA_DIR, invoke

KEY = "sk-bench-secret"


def target(max_model_len: int | None = 131_072, max_num_seqs: int | None = 8) -> Target:
    return Target(
        name="t",
        base_url="http://127.0.0.1:1",
        api_key=None,
        model="m",
        model_root="/models/m",
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
    )


# --- what gets measured -----------------------------------------------------------------------


def test_default_steps_use_the_standard_lengths_and_levels() -> None:
    steps = plan_steps(BenchOptions(), target())
    assert steps.lengths == (1024, 8192, 32768, 65536)
    assert steps.levels == (1, 2, 4)
    assert (steps.decode_tokens, steps.decode_requests) == (256, 3)


def test_quick_is_decode_and_one_length() -> None:
    steps = plan_steps(BenchOptions(mode="quick"), target())
    assert steps.lengths == (1024,)
    assert steps.levels == ()
    assert steps.decode_tokens == 128


def test_sweep_goes_up_to_max_num_seqs() -> None:
    assert plan_steps(BenchOptions(mode="sweep"), target(max_num_seqs=24)).levels == (
        1, 2, 4, 8, 16, 24,
    )  # fmt: skip
    assert plan_steps(BenchOptions(mode="sweep"), target(max_num_seqs=None)).levels[-1] == 64


def test_lengths_are_capped_by_max_model_len() -> None:
    steps = plan_steps(BenchOptions(), target(max_model_len=40_000))
    assert steps.lengths == (1024, 8192, 32768, 39936)
    assert steps.notes == ("prompt lengths capped at 39936 by max-model-len 40000",)
    tiny = plan_steps(BenchOptions(), target(max_model_len=1024, max_num_seqs=4))
    assert tiny.lengths == (1008,)
    assert tiny.level_prompt_tokens == 512
    assert tiny.decode_tokens == 256


def test_explicit_lengths_must_fit() -> None:
    with pytest.raises(BenchError) as caught:
        plan_steps(BenchOptions(lengths=(512, 2000)), target(max_model_len=1024))
    assert caught.value.one_line() == (
        "prompt length 2000 does not fit max-model-len 1024 (hint: use --lengths up to 1008)"
    )


# --- our load generator against known speeds -------------------------------------------------


@pytest.fixture
def scripted() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(
        api_key=KEY, model="scripted", max_model_len=8192, speculative=True
    ) as server:
        yield server


def test_load_measures_scripted_decode_and_prefill(scripted: FakeOpenAIServer) -> None:
    scripted.speeds.decode_per_token = 0.01  # at most 100 tok/s
    scripted.speeds.prefill_per_token = 0.0001  # at most 10,000 tok/s
    pool = TokenPool(range(100, 200), seed=3)
    result = run_load(scripted.url, KEY, "scripted", pool.prompts(500, 2), max_tokens=20)
    assert result.failed == 0
    first = result.requests[0]
    assert first.prompt_tokens == 500 and first.completion_tokens == 20
    # sleeping never makes the server faster than scripted; a loaded machine makes it slower
    assert 30 < result.per_request_tps <= 101  # type: ignore[operator]
    assert 0.05 <= result.mean_ttft_s < 1.0  # type: ignore[operator]
    assert 500 < result.prefill_tps <= 10_001  # type: ignore[operator]


def test_bursts_are_detected(scripted: FakeOpenAIServer) -> None:
    pool = TokenPool(range(100, 200), seed=5)
    scripted.speeds.decode_per_token = 0.005
    smooth = run_load(scripted.url, KEY, "scripted", pool.prompts(16, 2), max_tokens=32)
    assert smooth.bursty == 0
    scripted.speeds.burst = True
    burst = run_load(scripted.url, KEY, "scripted", pool.prompts(16, 2), max_tokens=32)
    assert burst.bursty == 2
    # a burst leaves no decode rate worth the name (all tokens in one read): hence the flag
    assert all(r.decode_tps is None or r.decode_tps > 10_000 for r in burst.requests)


def test_decode_rate_leaves_out_bursty_requests() -> None:
    from sm120.measure.load import LoadResult, RequestTiming

    smooth = RequestTiming(64, started=0.0, completion_tokens=101, first_at=0.1, last_at=1.1)
    burst = RequestTiming(64, started=0.0, completion_tokens=101, first_at=1.0, last_at=1.001)
    result = LoadResult(concurrency=1, duration_s=2.0, requests=[smooth, burst])
    assert (smooth.bursty, burst.bursty) == (False, True)
    assert result.bursty == 1
    assert result.smooth_decode_tps == pytest.approx(100.0)
    # with the burst in, the inverse mean of 100 and 100,000 tok/s
    assert result.per_request_tps == pytest.approx(1 / ((1 / 100 + 1 / 100_000) / 2))


def test_concurrency_aggregates_over_requests(scripted: FakeOpenAIServer) -> None:
    scripted.speeds.decode_per_token = 0.005
    pool = TokenPool(range(100, 200), seed=4)
    one = run_load(scripted.url, KEY, "scripted", pool.prompts(16, 4), max_tokens=20)
    four = run_load(
        scripted.url, KEY, "scripted", pool.prompts(16, 8), max_tokens=20, concurrency=4
    )
    assert four.output_tokens == 160 and four.failed == 0
    # four streams at once: more tokens per second in all than one stream
    assert four.aggregate_tps > one.aggregate_tps  # type: ignore[operator]


def test_failed_requests_are_counted_with_the_reason(scripted: FakeOpenAIServer) -> None:
    pool = TokenPool(range(100, 200))
    result = run_load(scripted.url, "sk-wrong", "scripted", pool.prompts(8, 2), max_tokens=4)
    assert result.failed == 2
    assert result.first_error == 'HTTP 401: {"error": "Unauthorized"}'


def test_median_ttft_shrugs_off_one_stalled_stream() -> None:
    from sm120.measure.load import LoadResult, RequestTiming

    quick = [RequestTiming(256, started=0.0, first_at=0.013, last_at=0.02) for _ in range(3)]
    stalled = RequestTiming(256, started=0.0, first_at=0.230, last_at=0.231)
    result = LoadResult(concurrency=1, duration_s=1.0, requests=[*quick, stalled])
    assert result.median_ttft_s == pytest.approx(0.013)
    assert result.mean_ttft_s == pytest.approx((3 * 0.013 + 0.230) / 4)


def test_an_unreachable_server_fails_every_request_with_the_reason() -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_load(f"http://127.0.0.1:{port}", KEY, "m", [[1, 2, 3]] * 2, max_tokens=2)
    assert result.failed == 2
    assert result.first_error == (
        f"ClientConnectorError: Cannot connect to host 127.0.0.1:{port} ssl:default "
        f"[Connect call failed ('127.0.0.1', {port})]"
    )


def test_token_pool_needs_variety() -> None:
    with pytest.raises(ValueError, match="at least 8 distinct ids"):
        TokenPool([1, 2, 3, 1, 2, 3])
    prompt = TokenPool(range(10, 20), seed=1).prompt(300)
    assert len(prompt) == 300 and set(prompt) <= set(range(10, 20))


def test_run_bench_with_our_tool(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    scripted.speeds.decode_per_token = 0.002
    found = target_for_url(scripted.url, None)
    options = BenchOptions(
        tool="ours", lengths=(64, 256), concurrency=(1, 2), decode_tokens=16, settle_s=0.0
    )
    report = run_bench(found, options, lambda _line: None, Path("unused"))
    assert report["decode"]["tool"] == "sm120" and report["decode"]["failed"] == 0
    assert [p["prompt_tokens"] for p in report["prefill"]] == [64, 256]
    assert [c["concurrency"] for c in report["concurrency"]] == [1, 2]
    assert report["tools"]["vllm bench serve"] == "not used (--tool ours)"
    spec = report["spec_decode"]
    assert spec["tool"] == "/metrics counters"
    assert spec["acceptance_rate"] == pytest.approx(2 / 3)
    assert spec["acceptance_length"] == pytest.approx(3.0)
    # each prefill length: one warm-up + 3 measured, all with different prompts
    completions = [b["prompt"] for p, b in scripted.requests if p == "/v1/completions"]
    assert len({tuple(prompt) for prompt in completions}) == len(completions)


def quick_bench(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, *, length: int, requests: int
) -> dict[str, Any]:
    """`sm120 bench --quick --tool ours` at one prompt length against the scripted server."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    options = BenchOptions(
        mode="quick",
        tool="ours",
        lengths=(length,),
        decode_tokens=8,
        requests=requests,
        settle_s=0.0,
    )
    return run_bench(target_for_url(scripted.url, None), options, print, Path("unused"))


def sent_prompts(scripted: FakeOpenAIServer) -> list[Any]:
    return [body["prompt"] for path, body in scripted.requests if path == "/v1/completions"]


def test_bench_sends_text_of_the_exact_length(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a client sends text, and tokenizing it is part of TTFT, as in vllm bench serve
    report = quick_bench(scripted, monkeypatch, length=48, requests=2)
    prompts = sent_prompts(scripted)
    assert all(isinstance(prompt, str) for prompt in prompts)
    # 2 decode prompts of 64 tokens, then 1 warm-up and 2 measured of 48
    assert [len(prompt.split()) for prompt in prompts] == [64, 64, 48, 48, 48]
    assert report["tools"]["sm120"] == bench.OURS_HOW
    point = report["prefill"][0]
    assert point["prompt_tokens"] == 48
    # each measured request's TTFT, in the order sent, the warm-up left out
    assert len(point["ttfts_ms"]) == 2
    median = statistics.median(point["ttfts_ms"])
    assert median == pytest.approx(point["median_ttft_s"] * 1000, abs=1e-3)
    assert not any("token ids" in note for note in report["notes"])


def test_without_detokenize_the_prompts_go_out_as_token_ids(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.detokenizes = False
    report = quick_bench(scripted, monkeypatch, length=48, requests=2)
    prompts = sent_prompts(scripted)
    assert [len(prompt) for prompt in prompts] == [64, 64, 48, 48, 48]
    assert all(isinstance(prompt, list) for prompt in prompts)
    assert report["tools"]["sm120"] == bench.OURS_HOW_IDS
    assert (
        "the server gave no exact-length text for our prompts (no /detokenize?): they went "
        "out as token ids, so TTFT leaves out tokenizing"
    ) in report["notes"]


def test_prompts_that_would_not_settle_as_text_are_counted(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sm120.measure import prompts

    real = prompts.exact_text
    calls = iter(range(100))

    def every_other(*args: Any) -> str | None:
        return real(*args) if next(calls) % 2 else None

    monkeypatch.setattr(prompts, "exact_text", every_other)
    report = quick_bench(scripted, monkeypatch, length=48, requests=2)
    sent = sent_prompts(scripted)
    assert [isinstance(prompt, str) for prompt in sent] == [False, True, False, True, False]
    assert report["tools"]["sm120"] == bench.OURS_HOW
    assert (
        "3 of 5 prompts did not tokenize back to their exact length as text and went out as "
        "token ids (their TTFT leaves out tokenizing)"
    ) in report["notes"]


def tokenizer_files(folder: Path, size: int = 40) -> Path:
    """A tokenizer.json of `size` base ids, the first two special (<s> and </s>)."""
    vocab = {"<s>": 0, "</s>": 1, **{f"p{i}": i for i in range(2, size)}}
    added = [{"id": i, "content": t, "special": True} for t, i in (("<s>", 0), ("</s>", 1))]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "BPE", "vocab": vocab}, "added_tokens": added})
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>"})
    )
    return folder


def random_bench(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, tokenizer: Path, **options: Any
) -> dict[str, Any]:
    """`quick_bench` against a server whose tokenizer files are in `tokenizer`."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    found = dataclasses.replace(target_for_url(scripted.url, None), model_root=str(tokenizer))
    chosen = BenchOptions(
        mode="quick", tool="ours", lengths=(48,), decode_tokens=8, requests=2, settle_s=0.0
    )
    return run_bench(found, dataclasses.replace(chosen, **options), print, Path("unused"))


def test_bench_builds_prompts_as_vllm_bench_serves_random_dataset(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    scripted.adds_bos = True
    report = random_bench(scripted, monkeypatch, tokenizer_files(tmp_path))
    # the fake's /detokenize spells id i as "wi": each prompt is a run of consecutive ids
    # over 2..39 (0 and 1 are special), wrapping, one id short of its length: the server adds
    # a BOS to text, as vLLM's random dataset expects
    runs = [[int(word[1:]) for word in prompt.split()] for prompt in sent_prompts(scripted)]
    assert [len(run) for run in runs] == [63, 63, 47, 47, 47]  # 2 decode, warm-up, 2 measured
    for run in runs:
        assert all(after == (before - 1) % 38 + 2 for before, after in itertools.pairwise(run))
    assert len({run[0] for run in runs}) == 5
    # as the server counted them: exact
    assert scripted.counters.prompt_tokens == 2 * 64 + 3 * 48
    assert report["prefix_cache"]["hit_tokens"] == 0
    assert report["tools"]["sm120"] == (
        "aiohttp, streamed /v1/completions, text prompts of exact token lengths, built as vllm "
        "bench serve --dataset-name random builds them (runs of consecutive ids over the "
        "tokenizer's 40-id vocabulary)"
    )
    assert not any("tokenizer.json" in note or "token ids" in note for note in report["notes"])


def test_without_tokenizer_files_the_prompts_are_drawn_from_text_and_the_report_says_so(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    report = random_bench(scripted, monkeypatch, tmp_path / "empty")
    assert report["tools"]["sm120"] == bench.OURS_HOW
    assert (
        f"no tokenizer.json to read ({tmp_path / 'empty'}): our prompts are ordinary-text "
        "tokens, not built as vllm bench serve's random dataset builds them, and tokenize "
        "differently"
    ) in report["notes"]
    # the pool's ids: what the fake's /tokenize made of ordinary text (1000 and up)
    words = [word for prompt in sent_prompts(scripted) for word in prompt.split()]
    assert all(int(word[1:]) >= 1000 for word in words)


def test_the_prompts_of_before_on_request(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    report = random_bench(scripted, monkeypatch, tokenizer_files(tmp_path), prompts="text-pool")
    assert report["tools"]["sm120"] == bench.OURS_HOW
    assert not any("tokenizer.json" in note for note in report["notes"])
    words = [word for prompt in sent_prompts(scripted) for word in prompt.split()]
    assert len(words) == 2 * 64 + 3 * 48 and all(int(word[1:]) >= 1000 for word in words)


def test_a_container_s_tokenizer_is_read_from_the_deployment_s_model_folder(
    tmp_path: Path,
) -> None:
    # the engine loaded /models/m inside its container; the folder it mounts is on the host
    state = dataclasses.replace(_state("docker"), model_dir=str(tokenizer_files(tmp_path)))
    found = dataclasses.replace(target(), state=state)
    assert bench._tokenizer_folders(found) == ["/models/m", str(tmp_path)]
    assert bench._tokenizer_folders(target()) == ["/models/m"]


def test_bench_notes_bursty_streams(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    scripted.speeds.burst = True
    scripted.speeds.decode_per_token = 0.01  # 16 tokens held back for 0.16 s, then flushed
    # the prompts of the way before: the fake's tokenizer files are nowhere to read, and the
    # note saying so is not what this test is about
    options = BenchOptions(
        tool="ours",
        lengths=(32,),
        concurrency=(),
        decode_tokens=16,
        settle_s=0.0,
        prompts="text-pool",
    )
    report = run_bench(target_for_url(scripted.url, None), options, print, Path("unused"))
    assert report["decode"]["bursty"] == 3
    # no inter-token time to invert: the end-to-end rate, never the 100k+ tok/s of a burst
    assert 30 < report["decode"]["tps"] <= 101
    assert report["notes"] == [
        "3 of 3 decode requests arrived in bursts (tokens held back, then sent at once); "
        "decode tok/s is counted end to end (a lower bound), as all of them did; is the "
        "server short of CPU?"
    ]


def test_fresh_prompts_never_hit_the_prefix_cache(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = quick_bench(scripted, monkeypatch, length=64, requests=3)
    # 3 decode prompts of 64, then 1 warm-up and 3 measured prompts of 64
    assert report["prefix_cache"] == {
        "queried_tokens": 7 * 64,
        "hit_tokens": 0,
        "tool": "/metrics counters",
    }
    assert not any("prefix cache" in note for note in report["notes"])


def test_prefix_cache_hits_are_reported(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:

    class RepeatingPool(TokenPool):
        """Every prompt of a length is the same prompt: vLLM's random dataset on a small
        vocabulary comes close to this."""

        def prompt(self, length: int) -> list[int]:
            return list(range(100, 100 + length))

    monkeypatch.setattr(bench, "TokenPool", RepeatingPool)
    report = quick_bench(scripted, monkeypatch, length=64, requests=2)
    # decode: 2 x 64, the second all cached; prefill: 3 x 64, all cached (the decode
    # prompts were of the same length, so the same prompt)
    assert report["prefix_cache"]["hit_tokens"] == 64 + 3 * 64
    assert (
        "the prefix cache served 256 of 320 prompt tokens during the run: TTFT and prefill "
        "figures may read fast"
    ) in report["notes"]


def test_each_measured_phase_starts_after_a_settle(
    scripted: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    calls: list[tuple[float, float, int]] = []  # (start, end, max_tokens) of each load
    real_load = bench._load

    def timed_load(run: bench.BenchRun, prompts: list, max_tokens: int, level: int):  # type: ignore[no-untyped-def,type-arg]
        started = time.perf_counter()
        result = real_load(run, prompts, max_tokens, level)
        calls.append((started, time.perf_counter(), max_tokens))
        return result

    monkeypatch.setattr(bench, "_load", timed_load)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    options = BenchOptions(
        tool="ours", lengths=(32,), concurrency=(1,), decode_tokens=16, requests=2, settle_s=0.4
    )
    run_bench(target_for_url(scripted.url, None), options, lambda _line: None, Path("unused"))
    decode, warm_up, prefill, level = calls
    assert [c[2] for c in calls] == [16, 8, 8, 128]
    # decode -> (settle) warm-up -> measured prefill at once -> (settle) concurrency 1
    assert warm_up[0] - decode[1] >= 0.4
    assert prefill[0] - warm_up[1] < 0.4
    assert level[0] - prefill[1] >= 0.4


FAKE_SERVE = """
import json, os, time
def add_cli_args(parser):
    parser.add_argument("--label")
    parser.add_argument("--result-dir")
    parser.add_argument("--result-filename")
def main(args):
    with open(os.path.join(args.result_dir, args.result_filename), "w") as out:
        json.dump({"label": args.label, "at": time.time()}, out)
"""


def test_the_shim_pauses_before_each_run(tmp_path: Path) -> None:
    # the shim as the engine's Python runs it, against a stand-in for vllm.benchmarks.serve
    package = tmp_path / "lib" / "vllm" / "benchmarks"
    package.mkdir(parents=True)
    for folder in (package.parent, package):
        (folder / "__init__.py").write_text("")
    (package / "serve.py").write_text(FAKE_SERVE)
    runs = [
        ["--label", label, "--result-dir", str(tmp_path), "--result-filename", f"{label}.json"]
        for label in ("a", "b")
    ]
    import subprocess
    import time

    started = time.time()
    done = subprocess.run(
        [sys.executable, "-c", SHIM, json.dumps(runs), "0.4"],
        env={"PYTHONPATH": str(tmp_path / "lib"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    results = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()]
    assert [r["label"] for r in results] == ["a", "b"]
    assert results[0]["at"] - started >= 0.4
    assert results[1]["at"] - results[0]["at"] >= 0.4
    argv = command_for([ServeRun("d", 64, 8, 2, 1, 1)], target(), NativeExec("py"), "/o", 2.5)
    assert argv[-1] == "2.5"


# --- /metrics -----------------------------------------------------------------------------


def test_spec_figures_from_a_real_vllm_metrics_page() -> None:
    page = (DATA_DIR / "metrics_ngram_spec.txt").read_text()
    counters = metrics.parse_counters(page)
    figures = metrics.spec_decode(metrics.difference({}, counters))
    assert figures is not None
    assert (figures.drafts, figures.draft_tokens, figures.accepted_tokens) == (10, 30, 0)
    assert figures.acceptance_rate == 0.0
    assert figures.acceptance_length == 1.0


def test_counters_difference_and_no_speculation() -> None:
    before = {metrics.SPEC_DRAFTS: 10.0, metrics.SPEC_DRAFT_TOKENS: 30.0}
    after = {metrics.SPEC_DRAFTS: 14.0, metrics.SPEC_DRAFT_TOKENS: 42.0, metrics.SPEC_ACCEPTED: 6}
    figures = metrics.spec_decode(metrics.difference(before, after))
    assert figures is not None and figures.acceptance_rate == 0.5
    assert metrics.spec_decode(metrics.difference(after, after)) is None  # no drafts in the run
    assert metrics.spec_decode({"vllm:prompt_tokens_total": 5.0}) is None
    # a restarted server: counters fell, the new value is the run's
    assert metrics.difference({"x": 100.0}, {"x": 7.0}) == {"x": 7.0}


# --- vllm bench serve plumbing --------------------------------------------------------------


def test_serve_args_and_command_never_carry_the_key() -> None:
    keyed = Target(
        name="t",
        base_url="http://127.0.0.1:8000",
        api_key=KEY,
        model="glm-5.2",
        model_root="/mnt/llm_models/GLM",
        max_model_len=250_000,
    )
    run = ServeRun("c4", 512, 128, 8, 4, 99)
    args = serve_args(run, keyed, "/tmp/out")
    assert args[args.index("--served-model-name") + 1] == "glm-5.2"
    assert args[args.index("--tokenizer") + 1] == "/mnt/llm_models/GLM"
    assert args[args.index("--max-concurrency") + 1] == "4"
    assert args[args.index("--result-filename") + 1] == "c4.json"
    assert "--save-detailed" in args  # per-request timings, for the burst rule
    argv = command_for([run], keyed, ContainerExec("sm120-glm52"), "/tmp/out")
    assert argv[:6] == ["docker", "exec", "-e", "OPENAI_API_KEY", "sm120-glm52", "python3"]
    assert argv[6:8] == ["-c", SHIM]
    assert json.loads(argv[8]) == [args]
    assert KEY not in " ".join(argv)


def test_parse_a_real_save_result_document() -> None:
    document = json.loads((DATA_DIR / "vllm_bench_serve_result.json").read_text())
    figures = parse_serve_result(document)
    assert (figures.completed, figures.failed, figures.output_tokens) == (2, 0, 256)
    assert figures.decode_tps == pytest.approx(1000 / 4.160032641731788)
    assert figures.median_ttft_ms == pytest.approx(82.71364650022406)
    assert figures.prefill_tps == pytest.approx((65 / 2) / 0.08271364650022406)
    assert figures.spec_acceptance_rate is None


def test_bursts_in_a_real_detailed_save_result_document() -> None:
    # a real `vllm bench serve --save-detailed` run on the tiny CPU server: 3 of its 8 decode
    # streams arrived whole after ~0.22 s (TTFT == latency), which vLLM counts as ~0 TPOT
    document = json.loads((DATA_DIR / "vllm_bench_serve_detailed.json").read_text())
    figures = parse_serve_result(document)
    assert figures.completed == 8 and figures.bursty == 3
    assert figures.decode_tps == pytest.approx(1000 / document["mean_tpot_ms"])
    smooth = [
        (latency - ttft) / (tokens - 1)
        for ttft, latency, tokens in zip(
            document["ttfts"], document["latencies"], document["output_lens"], strict=True
        )
        if latency - ttft > latency / 10
    ]
    assert len(smooth) == 5
    assert figures.smooth_tpot_ms == pytest.approx(1000 * sum(smooth) / 5)
    # vLLM's own figure, bursts in, reads far above what the smooth streams show
    assert figures.smooth_decode_tps is not None and figures.decode_tps is not None
    assert 400 < figures.smooth_decode_tps < 0.7 * figures.decode_tps


def test_per_request_ttfts_of_a_detailed_document_in_the_order_sent() -> None:
    document = json.loads((DATA_DIR / "vllm_bench_serve_detailed.json").read_text())
    figures = parse_serve_result(document)
    assert figures.ttfts_ms == tuple(round(t * 1000, 3) for t in document["ttfts"])
    failed = {**document, "errors": ["", "boom", *document["errors"][2:]]}
    assert len(parse_serve_result(failed).ttfts_ms) == 7


def test_a_summary_only_document_has_no_burst_figures() -> None:
    document = json.loads((DATA_DIR / "vllm_bench_serve_result.json").read_text())
    figures = parse_serve_result(document)
    assert (figures.bursty, figures.smooth_tpot_ms, figures.ttfts_ms) == (0, None, ())
    assert figures.smooth_decode_tps == figures.decode_tps


def test_failed_and_one_token_requests_are_left_out_of_the_burst_count() -> None:
    document = {
        "completed": 2,
        "mean_tpot_ms": 5.0,
        "ttfts": [0.01, 0.0, 0.5, 0.5],
        "latencies": [1.01, 0.0, 0.5, 0.501],
        "output_lens": [201, 0, 1, 101],
        "errors": ["", "HTTP 500", "", ""],
    }
    figures = parse_serve_result(document)
    # request 0: 1 s over 200 tokens; request 3: 1 ms over 100 tokens after 0.5 s, bursty
    assert figures.bursty == 1
    assert figures.smooth_tpot_ms == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("tokens", "ttft", "span", "bursty"),
    [
        (128, 0.01, 0.2, False),
        (128, 0.2, 0.001, True),  # everything held back and flushed at once
        (128, 0.9, 0.1, False),  # exactly a tenth of the request's time: not a burst
        (128, 0.9, 0.0999, True),
        (7, 0.2, 0.0, False),  # too few tokens to tell
        (None, 0.2, 0.0, False),
    ],
)
def test_the_burst_rule(tokens: int | None, ttft: float, span: float, bursty: bool) -> None:
    from sm120.measure.load import arrived_in_burst

    assert arrived_in_burst(tokens, ttft, span) is bursty


def test_decode_by_vllm_bench_serve_follows_the_same_burst_rule() -> None:
    from sm120.measure.bench import BenchRun, _decode, _header
    from sm120.measure.vllm_bench import ServeFigures

    def decode_of(figures: ServeFigures) -> tuple[dict[str, object], list[str]]:
        options = BenchOptions(tool="vllm")
        steps = plan_steps(options, target())
        run = BenchRun(target(), options, steps, print, Path("unused"))
        run.report = _header(target(), options, steps)
        _decode(run, {"decode": figures})
        return run.report["decode"], run.report["notes"]

    base = ServeFigures(
        completed=8,
        failed=0,
        duration_s=2.0,
        input_tokens=512,
        output_tokens=1024,
        output_throughput=512.0,
        mean_ttft_ms=10.0,
        mean_tpot_ms=1.0,
        spec_acceptance_rate=None,
        spec_acceptance_length=None,
    )
    decode, notes = decode_of(base)
    assert (decode["tps"], decode["tps_all_requests"], decode["bursty"]) == (1000.0, 1000.0, 0)
    assert notes == []
    decode, notes = decode_of(dataclasses.replace(base, bursty=3, smooth_tpot_ms=2.0))
    assert (decode["tps"], decode["tps_all_requests"], decode["bursty"]) == (500.0, 1000.0, 3)
    assert notes == [
        "3 of 8 decode requests arrived in bursts (tokens held back, then sent at once); "
        "decode tok/s is counted over the others; is the server short of CPU?"
    ]
    # every stream a burst: the end-to-end rate, a true lower bound
    decode, notes = decode_of(dataclasses.replace(base, bursty=8, smooth_tpot_ms=None))
    assert decode["tps"] == 512.0
    assert "end to end (a lower bound)" in notes[0]


def test_spec_acceptance_percent_becomes_a_fraction() -> None:
    figures = parse_serve_result({"spec_decode_acceptance_rate": 68.36, "completed": 1})
    assert figures.spec_acceptance_rate == pytest.approx(0.6836)


def _state(runtime: str = "native", engine_pid: int | None = None) -> DeploymentState:
    return DeploymentState(
        name="d",
        recipe="tiny",
        runtime=runtime,
        supervisor_pid=4_194_304,  # PID_MAX_LIMIT itself: never a live process
        engine_pid=engine_pid,
        host="127.0.0.1",
        port=1,
        plan_hash="h",
        started_at=0.0,
        log_path="/nonexistent/serve.log",
        exit_file="/nonexistent/exit.json",
        served_model_name="m",
        model_dir=None,
        api_key_file=None,
    )


def test_engine_exec_seams(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a container: docker exec with the plan's interpreter in the image
    container = dataclasses.replace(_state("docker"), container_id="0123456789abcdef0123")
    docker = Target(**{**target().__dict__, "state": container, "engine_python": "/opt/v/python"})
    assert engine_exec_for(docker, None) == ContainerExec("0123456789ab", python="/opt/v/python")
    # a warded container has no network: nothing inside it could reach the engine
    warded = Target(**{**docker.__dict__, "state": dataclasses.replace(
        container, engine_socket="/s/api.sock")})  # fmt: skip
    with pytest.raises(BenchToolError, match="warded deployment's container has no network"):
        engine_exec_for(warded, None)
    # another runtime with no way in yet
    cluster = Target(**{**target().__dict__, "state": _state("cluster")})
    with pytest.raises(BenchToolError) as caught:
        engine_exec_for(cluster, None)
    assert caught.value.one_line() == (
        "running vllm bench serve in a 'cluster' deployment is not wired yet "
        "(hint: use --tool ours, or --vllm-python PATH for a local vLLM)"
    )
    # a native engine: the interpreter of the running engine process (here: this test's)
    import os

    running = Target(**{**target().__dict__, "state": _state(engine_pid=os.getpid())})
    found = engine_exec_for(running, None)
    assert isinstance(found, NativeExec)
    assert Path(found.python).name.startswith("python")
    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    with pytest.raises(BenchToolError, match="no vLLM engine found"):
        engine_exec_for(target(), None)
    assert engine_exec_for(target(), sys.executable) == NativeExec(sys.executable)


# --- history and regressions ----------------------------------------------------------------


def report_with(decode: float, prefill: float, aggregate: float, key: str = "k") -> dict:  # type: ignore[type-arg]
    return {
        "key": key,
        "decode": {"tps": decode},
        "prefill": [{"prompt_tokens": 65536, "prefill_tps": prefill}],
        "concurrency": [{"concurrency": 4, "aggregate_tps": aggregate}],
    }


def test_history_is_keyed() -> None:
    history.append(report_with(60, 5000, 150))
    history.append(report_with(61, 5000, 150, key="other"))
    assert [r["decode"]["tps"] for r in history.records("k")] == [60]
    path = history.history_path()
    path.write_text(path.read_text() + "not json\n")
    assert len(history.records("k")) == 1


def test_compare_with_baseline_and_previous() -> None:
    baseline = {"decode_tps": 60, "prefill_tps": 5100}
    found = history.compare(report_with(50, 5000, 100), baseline, report_with(60, 5000, 150), 0.10)
    verdicts = {(c.figure, c.against): c.regression for c in found}
    assert verdicts == {
        ("decode tok/s", "baseline"): True,  # 50 vs 60: -16.7%
        ("prefill tok/s @ 65536", "baseline"): False,  # -2.0%
        ("decode tok/s", "previous"): True,
        ("prefill tok/s @ 65536", "previous"): False,
        ("aggregate tok/s @ C=4", "previous"): True,
    }


def test_short_prompts_are_not_compared_with_a_long_prompt_baseline() -> None:
    short = report_with(60, 900, 150)
    short["prefill"] = [{"prompt_tokens": 1024, "prefill_tps": 900}]
    found = history.compare(short, {"decode_tps": 60, "prefill_tps": 5100}, None)
    assert [c.figure for c in found] == ["decode tok/s"]


@pytest.fixture
def deployment(scripted: FakeOpenAIServer, isolated_home: Path) -> Iterator[FakeOpenAIServer]:
    """A deployment in the state dir whose server is the scripted one, with a saved plan."""
    key_file = isolated_home / "api_key"
    isolated_home.mkdir(parents=True, exist_ok=True)
    key_file.write_text(KEY)
    port = int(scripted.url.rsplit(":", 1)[1])
    state = _state(engine_pid=None)
    state.port, state.served_model_name, state.api_key_file = port, "scripted", str(key_file)
    save_state(state)
    plan = {
        "plan_hash": "h",
        "image": "vllm/vllm-openai:v0.32.0",
        "argv": ["python3", "-m", "vllm", "--max-model-len", "8192", "--max-num-seqs", "2"],
        "baseline": {"source": "test", "decode_tps": 1_000_000},
        "published": {"decode_tok_s": 1000, "source": "https://example.org/figures"},
        "roofline_decode_tok_s": 2000,
        "speculative": {"method": "ngram", "num_speculative_tokens": 3},
        "thinking": False,
    }
    save_plan("d", plan)
    yield scripted


def test_cli_bench_against_a_deployment_flags_the_baseline(
    deployment: FakeOpenAIServer, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    deployment.speeds.decode_per_token = 0.001
    code, out, err = invoke(
        cli, "bench", "--lengths", "64", "--decode-tokens", "8", "--requests", "2", "--json",
        "--settle", "0",
    )  # fmt: skip
    assert code == 0, err  # flagged, but only --fail-on-regression turns it into exit 1
    report = json.loads(out)
    # A native run names no image (the plan's is for container runs): its history is kept
    # under the runtime's name.
    assert (report["key"], report["image"], report["runtime"]) == ("native|h", None, "native")
    assert report["max_model_len"] == 8192
    assert [c["concurrency"] for c in report["concurrency"]] == [1, 2]  # max-num-seqs 2
    assert report["tools"]["vllm bench serve"].startswith("unavailable: no vLLM engine found")
    assert report["decode"]["tool"] == "sm120"
    assert report["comparisons"][0]["figure"] == "decode tok/s"
    assert report["comparisons"][0]["regression"] is True
    against, measured = report["against"], report["decode"]["tps"]
    assert against["of_published"] == pytest.approx(measured / 1000)
    assert against["of_roofline"] == pytest.approx(measured / 2000)
    assert against["published_source"] == "https://example.org/figures"
    assert "regression beyond the threshold: decode tok/s vs baseline" in err
    assert KEY not in out + err
    code, _, _ = invoke(
        cli, "bench", "--quick", "--lengths", "64", "--fail-on-regression", "--settle", "0"
    )
    assert code == 1
    assert len(history.records("native|h")) == 2


def test_only_a_container_run_names_its_image(deployment: FakeOpenAIServer) -> None:
    from sm120.engine.state import load_state
    from sm120.measure.present import show_bench
    from sm120.measure.target import target_for_deployment

    native = target_for_deployment("d")
    assert (native.image, native.history_key) == (None, "native|h")
    state = load_state("d")
    assert state is not None
    state.runtime = "docker"
    save_state(state)
    container = target_for_deployment("d")
    assert container.image == "vllm/vllm-openai:v0.32.0"
    assert container.history_key == "vllm/vllm-openai:v0.32.0|h"
    out = io.StringIO()
    report = {"deployment": "d", "model": "m", "image": None, "runtime": "native", "mode": "q"}
    show_bench({**report, "plan_hash": "h"}, Console(file=out, width=200))
    assert out.getvalue().splitlines()[0] == "d  model m  runtime native  plan h  mode q"


def test_cli_bench_text_report(deployment: FakeOpenAIServer, cli: CliRunner) -> None:
    code, out, _ = invoke(
        cli, "bench", "--tool", "ours", "--lengths", "32,64", "--concurrency", "1,2",
        "--decode-tokens", "8", "--requests", "2", "--no-save", "--settle", "0",
    )  # fmt: skip
    assert code == 0
    assert "decode (single stream, 8 tokens):" in out
    assert "speculative decoding (ngram, 3 draft tokens): acceptance 66.7%, length 3.00" in out
    assert re.search(
        r"decode [\d,.]+ tok/s is \d+% of the published 1,000.0 tok/s "
        r"\(https://example.org/figures\)",
        out,
    )
    assert re.search(r"decode [\d,.]+ tok/s is \d+% of the roofline 2,000.0 tok/s", out)
    assert "sm120: aiohttp, streamed /v1/completions, text prompts of exact token lengths" in out
    assert history.records("vllm/vllm-openai:v0.32.0|h") == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--quick", "--sweep"], "Error: --quick and --sweep exclude each other (hint: pick one)"),
        (["--tool", "mine"], "Error: unknown --tool 'mine' (hint: use auto, vllm or ours)"),
        (
            ["--lengths", "1k"],
            "Error: --lengths expects comma-separated positive integers, got '1k' "
            "(hint: e.g. --lengths 1024,8192)",
        ),
        (
            ["--concurrency", "0,2"],
            "Error: --concurrency expects comma-separated positive integers, got '0,2' "
            "(hint: e.g. --concurrency 1024,8192)",
        ),
        (
            ["--threshold", "1.5"],
            "Error: --threshold must be less than 1, got 1.5 (hint: e.g. 0.10)",
        ),
        (
            ["--decode-tokens", "1"],
            "Error: --decode-tokens must be 2 or more, got 1 (hint: e.g. --decode-tokens 8)",
        ),
        (
            ["--settle", "-1"],
            "Error: --settle must be 0 or more, got -1 (hint: e.g. --settle 2)",
        ),
        (
            ["--name", "nope"],
            "Error: no deployment named 'nope' "
            "(hint: 'sm120 status' lists them; start one with 'sm120 launch')",
        ),
    ],
)
def test_cli_bench_input_errors(cli: CliRunner, args: list[str], message: str) -> None:
    code, out, err = invoke(cli, "bench", *args)
    assert (code, out, err.strip()) == (2, "", message)


def test_cli_bench_length_beyond_the_plan(deployment: FakeOpenAIServer, cli: CliRunner) -> None:
    code, _, err = invoke(cli, "bench", "--lengths", "9000")
    assert code == 2
    assert err.strip() == (
        "Error: prompt length 9000 does not fit max-model-len 8192 (hint: use --lengths up to 8176)"
    )


def test_decode_against_needs_a_measurement_and_a_reference() -> None:
    report = {"decode": {"tps": 50.0}}
    assert decode_against({"decode": {}}, {"decode_tok_s": 60}, 100.0) is None
    assert decode_against(report, None, None) is None
    only_roofline = decode_against(report, None, 200.0)
    assert only_roofline is not None
    assert (only_roofline["of_published"], only_roofline["of_roofline"]) == (None, 0.25)
    both = decode_against(report, {"decode_tok_s": 40, "source": "https://x.org"}, 100.0)
    assert both is not None and (both["of_published"], both["of_roofline"]) == (1.25, 0.5)


def test_configured_speculation_without_draft_counters_is_named() -> None:
    report = {
        "deployment": "d",
        "model": "m",
        "mode": "quick",
        "decode": {"tps": 10.0, "output_tokens": 8, "tool": "sm120"},
        "spec_decode": None,
        "speculative": {"method": "mtp", "num_speculative_tokens": 2},
    }
    console = Console(record=True, width=200)
    show_bench(report, console)
    assert (
        "speculative decoding (mtp, 2 draft tokens): configured, but no draft counters moved in "
        "/metrics" in console.export_text()
    )
    console = Console(record=True, width=200)
    show_bench({**report, "speculative": None}, console)
    assert "speculative decoding: none (no draft counters moved in /metrics)" in (
        console.export_text()
    )


def test_the_prefix_cache_share_is_shown_when_counted() -> None:
    report = {
        "deployment": "d",
        "model": "m",
        "mode": "quick",
        "decode": {"tps": 10.0, "output_tokens": 8, "tool": "sm120"},
        "spec_decode": None,
        "prefix_cache": {"queried_tokens": 1000, "hit_tokens": 125, "tool": "/metrics counters"},
    }
    console = Console(record=True, width=200)
    show_bench(report, console)
    assert "prefix cache: 12.5% of 1,000 prompt tokens served from the cache" in (
        console.export_text()
    )
    console = Console(record=True, width=200)
    show_bench({**report, "prefix_cache": None}, console)
    assert "prefix cache:" not in console.export_text()
