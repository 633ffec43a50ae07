"""`sm120 bench`: decode, prefill and concurrency figures for a running deployment.

Which tool measures what (`--tool auto`):
  decode and the concurrency sweep  -> `vllm bench serve` in the engine's environment, the
                                       well-kept tool, when it can run there; else ours
  TTFT / prefill at each length     -> ours: text prompts built as vLLM's random dataset
                                       builds them, at exact lengths, and a streamed TTFT
                                       per request
  speculative-decoding acceptance   -> the server's /metrics counters, before and after
Every figure in the report names the tool that produced it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sm120.core.defaults import BENCH_SETTLE_S
from sm120.core.errors import SM120Error
from sm120.measure import metrics
from sm120.measure.load import LoadResult, Prompt, TokenPool, run_load, text_prompts
from sm120.measure.prompts import ConsecutiveIds, RandomDatasetPrompts, TextPrompts
from sm120.measure.target import Target
from sm120.measure.text import vocabulary_sample
from sm120.measure.vllm_bench import (
    TOOL_NAME,
    BenchToolError,
    EngineExec,
    ServeFigures,
    ServeRun,
    engine_exec_for,
    parse_serve_result,
    run_serve_benchmarks,
)
from sm120.measure.vocabulary import Vocabulary, find_vocabulary
from sm120.server.wire import Wire

OURS = "sm120"
OURS_HOW = "aiohttp, streamed /v1/completions, text prompts of exact token lengths"
OURS_HOW_RANDOM = (
    OURS_HOW + ", built as vllm bench serve --dataset-name random builds them (runs of "
    "consecutive ids over the tokenizer's {size:,}-id vocabulary)"
)
OURS_HOW_IDS = "aiohttp, streamed /v1/completions, exact token-id prompts"
OURS_HOW_APPROXIMATE = "aiohttp, streamed /v1/completions, text prompts of approximate lengths"
METRICS = "/metrics counters"
STANDARD_LENGTHS = (1024, 8192, 32768, 65536)
DECODE_PROMPT_TOKENS = 64
PREFILL_OUTPUT_TOKENS = 8
SWEEP_PROMPT_TOKENS = 512
SWEEP_OUTPUT_TOKENS = 128

Mode = Literal["quick", "default", "sweep"]
Tool = Literal["auto", "vllm", "ours"]
PromptSource = Literal["vllm-random", "text-pool"]
Progress = Callable[[str], None]


class BenchError(SM120Error):
    """The benchmark cannot run as asked."""


@dataclass(frozen=True)
class BenchOptions:
    mode: Mode = "default"
    tool: Tool = "auto"
    lengths: tuple[int, ...] | None = None
    concurrency: tuple[int, ...] | None = None
    decode_tokens: int | None = None
    requests: int | None = None
    """Measured requests per prompt length / per decode run (sweeps scale with the level)."""
    vllm_python: str | None = None
    # A phase that follows another at once inherits its leftovers: on the CPU build the worker
    # thread keeps spinning on a full core for about a second after the last decode step, and
    # a 256-token TTFT measured in that window read ~23 ms instead of ~13 ms in 4 of 8 runs
    # (1 of 8 after a 3 s pause). `vllm bench serve` pauses seconds between runs on its own
    # (tokenizer, dataset), so without this the two tools would not measure the same server.
    settle_s: float = BENCH_SETTLE_S
    """Pause before each measured phase, whichever tool runs it."""
    prompts: PromptSource = "vllm-random"
    """How our prompts are made: as `vllm bench serve`'s random dataset makes them (when the
    tokenizer's files can be read), or drawn from ordinary-text tokens (the way before)."""


@dataclass(frozen=True)
class BenchSteps:
    """What will be measured, after the plan's limits were applied."""

    decode_tokens: int
    decode_requests: int
    lengths: tuple[int, ...]
    length_requests: int
    levels: tuple[int, ...]
    level_prompt_tokens: int
    level_output_tokens: int
    notes: tuple[str, ...] = ()

    def requests_at(self, level: int) -> int:
        return max(4, 2 * level)


def _mode_defaults(mode: Mode) -> tuple[int, int, int]:
    """(decode tokens, requests per point, highest default concurrency)."""
    if mode == "quick":
        return 128, 2, 1
    if mode == "sweep":
        return 256, 3, 0  # 0: up to what the server admits
    return 256, 3, 4


def plan_steps(options: BenchOptions, target: Target) -> BenchSteps:
    decode_tokens, per_point, top_level = _mode_defaults(options.mode)
    decode_tokens = options.decode_tokens or decode_tokens
    per_point = options.requests or per_point
    limit = target.max_model_len
    notes: list[str] = []
    if limit is not None and DECODE_PROMPT_TOKENS + decode_tokens > limit:
        decode_tokens = limit - DECODE_PROMPT_TOKENS
        notes.append(f"decode capped at {decode_tokens} tokens by max-model-len {limit}")
    lengths = _lengths(options, limit, notes)
    levels = _levels(options, target, top_level)
    prompt_tokens = SWEEP_PROMPT_TOKENS
    if limit is not None and prompt_tokens + SWEEP_OUTPUT_TOKENS > limit:
        prompt_tokens = max(16, limit - SWEEP_OUTPUT_TOKENS - 8)
    return BenchSteps(
        decode_tokens=decode_tokens,
        decode_requests=per_point,
        lengths=lengths,
        length_requests=per_point,
        levels=levels,
        level_prompt_tokens=prompt_tokens,
        level_output_tokens=SWEEP_OUTPUT_TOKENS,
        notes=tuple(notes),
    )


def _lengths(options: BenchOptions, limit: int | None, notes: list[str]) -> tuple[int, ...]:
    room = None if limit is None else limit - PREFILL_OUTPUT_TOKENS - 8
    if options.lengths:
        too_long = [n for n in options.lengths if room is not None and n > room]
        if too_long:
            raise BenchError(
                f"prompt length {too_long[0]} does not fit max-model-len {limit}",
                f"use --lengths up to {room}",
            )
        return tuple(options.lengths)
    wanted = STANDARD_LENGTHS[:1] if options.mode == "quick" else STANDARD_LENGTHS
    fitting = tuple(n for n in wanted if room is None or n <= room)
    if room is not None and len(fitting) < len(wanted):
        longest = room if room < 1024 else room // 256 * 256
        notes.append(f"prompt lengths capped at {longest} by max-model-len {limit}")
        fitting = (*fitting, longest) if longest not in fitting else fitting
    return fitting


def _levels(options: BenchOptions, target: Target, top: int) -> tuple[int, ...]:
    if options.concurrency:
        return tuple(options.concurrency)
    if options.mode == "quick":
        return ()
    admitted = target.max_num_seqs or 64
    ceiling = min(top, admitted) if top else admitted
    levels, level = [], 1
    while level <= ceiling:
        levels.append(level)
        level *= 2
    if options.mode == "sweep" and levels and levels[-1] < admitted:
        levels.append(admitted)
    return tuple(levels)


# --- running ------------------------------------------------------------------------------


@dataclass
class BenchRun:
    target: Target
    options: BenchOptions
    steps: BenchSteps
    progress: Progress
    result_dir: Path
    report: dict[str, Any] = field(default_factory=dict)
    _pool: TokenPool | None = None
    _random: ConsecutiveIds | None = None
    _vocabulary: Vocabulary | None = None
    _specials: int = 0
    _seed: int = 0
    prompts_made: int = 0
    prompts_as_ids: int = 0

    def prompts(self, length: int, count: int) -> list[Prompt]:
        self._seed += 1
        if self._pool is None and self._random is None:
            return text_prompts(length, count, seed=self._seed)
        with self.target.wire(timeout=600.0) as wire:
            if self._random is not None:
                maker = RandomDatasetPrompts(wire, self.target.model, self._random, self._specials)
                made = maker.make(length, count)
                as_ids = maker.as_ids
            else:
                assert self._pool is not None
                drawn = [self._pool.prompt(length) for _ in range(count)]
                pooled = TextPrompts(wire, self.target.model, self._pool)
                made = pooled.make(drawn, length)
                as_ids = pooled.as_ids
        self.prompts_made += count
        self.prompts_as_ids += as_ids
        return made


def run_bench(
    target: Target, options: BenchOptions, progress: Progress, result_dir: Path
) -> dict[str, Any]:
    steps = plan_steps(options, target)
    run = BenchRun(target, options, steps, progress, result_dir)
    run.report = _header(target, options, steps)
    executor = _vllm_executor(run)
    with target.wire(timeout=600.0) as wire:
        before = metrics.parse_counters(wire.metrics_text() or "")
        _choose_prompts(run, wire)
    vllm_figures = _run_vllm(run, executor) if executor is not None else {}
    _decode(run, vllm_figures)
    _prefill(run, vllm_figures)
    _concurrency(run, vllm_figures)
    with target.wire(timeout=60.0) as wire:
        after = metrics.parse_counters(wire.metrics_text() or "")
    delta = metrics.difference(before, after)
    spec = metrics.spec_decode(delta)
    run.report["spec_decode"] = None if spec is None else {**spec.as_dict(), "tool": METRICS}
    _prefix_cache(run, metrics.prefix_cache(delta))
    figures = [run.report["decode"] or {}, *run.report["prefill"], *run.report["concurrency"]]
    if any(figure.get("tool") == OURS for figure in figures):
        run.report["tools"][OURS] = _how_we_prompted(run)
    return run.report


def _choose_prompts(run: BenchRun, wire: Wire) -> None:
    """vLLM's random-dataset construction where the server tokenizes both ways and the
    tokenizer's files can be read; else ids drawn from ordinary text; else approximate text."""
    model, seed = run.target.model, int(time.time())
    ids = wire.tokenize(model, prompt=vocabulary_sample())
    if not ids or len(set(ids)) < 8:
        run.report["notes"].append("no /tokenize: prompt lengths are approximate (text)")
        return
    run._pool = TokenPool(ids, seed=seed)
    if run.options.prompts != "vllm-random" or wire.detokenize(model, ids[:4]) is None:
        return
    folders = _tokenizer_folders(run.target)
    vocabulary = find_vocabulary(folders)
    if vocabulary is None:
        looked = ", ".join(folders) or "no folder known"
        run.report["notes"].append(
            f"no tokenizer.json to read ({looked}): our prompts are ordinary-text tokens, not "
            "built as vllm bench serve's random dataset builds them, and tokenize differently"
        )
        return
    with_specials = wire.tokenize(model, prompt=vocabulary_sample(), special_tokens=True)
    run._random = ConsecutiveIds(vocabulary, seed)
    run._vocabulary = vocabulary
    run._specials = max(0, len(with_specials or ids) - len(ids))


def _tokenizer_folders(target: Target) -> list[str]:
    """Where the served tokenizer's files may be on this machine: the path the engine loaded
    (a native deployment, a local URL), else the deployment's model folder (a container
    loads it from a mount, under another path)."""
    state_dir = target.state.model_dir if target.state is not None else None
    return [folder for folder in (target.model_root, state_dir) if folder]


def _how_we_prompted(run: BenchRun) -> str:
    if run._pool is None:
        return OURS_HOW_APPROXIMATE
    made, as_ids = run.prompts_made, run.prompts_as_ids
    if made and as_ids == made:
        run.report["notes"].append(
            "the server gave no exact-length text for our prompts (no /detokenize?): they "
            "went out as token ids, so TTFT leaves out tokenizing"
        )
        return OURS_HOW_IDS
    if as_ids:
        run.report["notes"].append(
            f"{as_ids} of {made} prompts did not tokenize back to their exact length as text "
            "and went out as token ids (their TTFT leaves out tokenizing)"
        )
    if run._vocabulary is not None:
        return OURS_HOW_RANDOM.format(size=run._vocabulary.size)
    return OURS_HOW


def _prefix_cache(run: BenchRun, figures: metrics.PrefixCacheFigures | None) -> None:
    """Every prompt is meant to be new. A cached prefix makes TTFT read fast: `vllm bench
    serve`'s random prompts are runs of consecutive token ids, so on a small vocabulary
    (the tiny model has 512 ids) one run's prompt often starts where an earlier one did.
    Ours are built the same way but never from a start used before in the run."""
    run.report["prefix_cache"] = None if figures is None else {**figures.as_dict(), "tool": METRICS}
    if figures is not None and figures.hit_tokens:
        run.report["notes"].append(
            f"the prefix cache served {figures.hit_tokens:,} of {figures.queried_tokens:,} "
            "prompt tokens during the run: TTFT and prefill figures may read fast"
        )


def _header(target: Target, options: BenchOptions, steps: BenchSteps) -> dict[str, Any]:
    return {
        "deployment": target.name,
        "recipe": target.recipe,
        "image": target.image,
        "runtime": target.runtime,
        "plan_hash": target.plan_hash,
        "key": target.history_key,
        "model": target.model,
        "endpoint": f"{target.base_url}/v1",
        "max_model_len": target.max_model_len,
        "mode": options.mode,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tools": {},
        "notes": list(steps.notes),
        "decode": None,
        "prefill": [],
        "concurrency": [],
    }


def _vllm_executor(run: BenchRun) -> EngineExec | None:
    if run.options.tool == "ours":
        run.report["tools"][TOOL_NAME] = "not used (--tool ours)"
        return None
    try:
        executor = engine_exec_for(run.target, run.options.vllm_python)
    except BenchToolError as exc:
        if run.options.tool == "vllm":
            raise
        run.report["tools"][TOOL_NAME] = f"unavailable: {exc.message}"
        return None
    run.report["tools"][TOOL_NAME] = executor.description
    return executor


def _vllm_runs(run: BenchRun) -> list[ServeRun]:
    steps, seed = run.steps, int(time.time()) % 100_000
    runs = [
        ServeRun(
            "decode", DECODE_PROMPT_TOKENS, steps.decode_tokens, steps.decode_requests, 1, seed
        )
    ]
    if run.options.tool == "vllm":
        for length in steps.lengths:
            # A separate warm-up run: vLLM's own warm-up repeats the first prompt, which
            # would make the measured first request a prefix-cache hit.
            runs.append(
                ServeRun(f"warmup-{length}", length, PREFILL_OUTPUT_TOKENS, 1, 1, seed + length)
            )
            runs.append(
                ServeRun(
                    f"prefill-{length}",
                    length,
                    PREFILL_OUTPUT_TOKENS,
                    steps.length_requests,
                    1,
                    seed + 2 * length + 1,
                )
            )
    for level in steps.levels:
        runs.append(
            ServeRun(
                f"c{level}",
                steps.level_prompt_tokens,
                steps.level_output_tokens,
                steps.requests_at(level),
                level,
                seed + 7 * level + 3,
            )
        )
    return runs


def _run_vllm(run: BenchRun, executor: EngineExec) -> dict[str, ServeFigures]:
    runs = _vllm_runs(run)
    run.progress(f"{TOOL_NAME}: {len(runs)} runs in one process ({executor.description})")
    try:
        documents = run_serve_benchmarks(
            runs,
            run.target,
            executor,
            run.result_dir,
            on_line=lambda line: run.progress(line),
            settle_s=run.options.settle_s,
        )
    except BenchToolError as exc:
        if run.options.tool == "vllm":
            raise
        run.report["tools"][TOOL_NAME] = f"failed, measured with sm120 instead: {exc.message}"
        return {}
    return {r.label: parse_serve_result(doc) for r, doc in zip(runs, documents, strict=True)}


def _decode(run: BenchRun, vllm: dict[str, ServeFigures]) -> None:
    steps = run.steps
    figures = vllm.get("decode")
    if figures is not None:
        run.report["decode"] = {
            **_decode_figure(
                run,
                smooth=figures.smooth_decode_tps,
                every=figures.decode_tps,
                end_to_end=figures.output_throughput,
                bursty=figures.bursty,
                completed=figures.completed,
            ),
            "output_tokens": steps.decode_tokens,
            **_counted_by_vllm(figures),
        }
        return
    run.progress(f"decode: {steps.decode_requests} x {steps.decode_tokens} tokens")
    _settle(run)
    prompts = run.prompts(DECODE_PROMPT_TOKENS, steps.decode_requests)
    result = _load(run, prompts, steps.decode_tokens, 1)
    run.report["decode"] = {
        **_decode_figure(
            run,
            smooth=result.smooth_decode_tps,
            every=result.per_request_tps,
            end_to_end=result.aggregate_tps,
            bursty=result.bursty,
            completed=len(result.completed),
        ),
        "output_tokens": steps.decode_tokens,
        **_counted_by_us(result),
    }


def _decode_figure(
    run: BenchRun,
    *,
    smooth: float | None,
    every: float | None,
    end_to_end: float | None,
    bursty: int,
    completed: int,
) -> dict[str, Any]:
    """One rule for either tool: the inverse mean time per output token over the streams
    that did not arrive in bursts. With every stream held back and flushed at once there is
    no inter-token time to invert (it would read as 100k+ tok/s): the end-to-end rate is a
    true lower bound then. `tps_all_requests` keeps the figure over every stream."""
    if bursty:
        counted = (
            "end to end (a lower bound), as all of them did"
            if smooth is None
            else "over the others"
        )
        run.report["notes"].append(
            f"{bursty} of {completed} decode requests arrived in bursts (tokens held back, "
            f"then sent at once); decode tok/s is counted {counted}; is the server short of "
            "CPU?"
        )
    return {
        "tps": smooth if smooth is not None else end_to_end,
        "tps_all_requests": every,
        "bursty": bursty,
    }


def _prefill(run: BenchRun, vllm: dict[str, ServeFigures]) -> None:
    steps = run.steps
    for length in steps.lengths:
        figures = vllm.get(f"prefill-{length}")
        if figures is not None:
            run.report["prefill"].append(
                {
                    "prompt_tokens": length,
                    "ttft_s": _seconds(figures.mean_ttft_ms),
                    "median_ttft_s": _seconds(figures.median_ttft_ms),
                    "prefill_tps": figures.prefill_tps,
                    "ttfts_ms": list(figures.ttfts_ms),
                    **_counted_by_vllm(figures),
                }
            )
            continue
        run.progress(f"prefill: {length} tokens (1 warm-up + {steps.length_requests})")
        _settle(run)
        _load(run, run.prompts(length, 1), PREFILL_OUTPUT_TOKENS, 1)  # compile / warm this size
        result = _load(run, run.prompts(length, steps.length_requests), PREFILL_OUTPUT_TOKENS, 1)
        run.report["prefill"].append(
            {
                "prompt_tokens": length,
                "ttft_s": result.mean_ttft_s,
                "median_ttft_s": result.median_ttft_s,
                "prefill_tps": result.prefill_tps,
                "ttfts_ms": [round(ttft * 1000.0, 3) for ttft in result.ttfts],
                **_counted_by_us(result),
            }
        )


def _concurrency(run: BenchRun, vllm: dict[str, ServeFigures]) -> None:
    steps = run.steps
    for level in steps.levels:
        figures = vllm.get(f"c{level}")
        if figures is not None:
            run.report["concurrency"].append(
                {
                    "concurrency": level,
                    "aggregate_tps": figures.output_throughput,
                    "per_request_tps": figures.decode_tps,
                    "mean_ttft_s": _seconds(figures.mean_ttft_ms),
                    **_counted_by_vllm(figures),
                }
            )
            continue
        count = steps.requests_at(level)
        run.progress(f"concurrency {level}: {count} requests")
        _settle(run)
        prompts = run.prompts(steps.level_prompt_tokens, count)
        result = _load(run, prompts, steps.level_output_tokens, level)
        run.report["concurrency"].append(
            {
                "concurrency": level,
                "aggregate_tps": result.aggregate_tps,
                "per_request_tps": result.per_request_tps,
                "mean_ttft_s": result.mean_ttft_s,
                **_counted_by_us(result),
            }
        )


def _settle(run: BenchRun) -> None:
    if run.options.settle_s > 0:
        time.sleep(run.options.settle_s)


def _load(run: BenchRun, prompts: Sequence[Prompt], max_tokens: int, level: int) -> LoadResult:
    target = run.target
    return run_load(
        target.base_url,
        target.api_key,
        target.model,
        prompts,
        max_tokens=max_tokens,
        concurrency=level,
    )


# Every figure ends the same way, so that a report can be read without knowing which tool
# made which row: how many requests it rests on, how many failed, and the tool.
def _counted_by_vllm(figures: ServeFigures) -> dict[str, Any]:
    return {"requests": figures.completed, "failed": figures.failed, "tool": TOOL_NAME}


def _counted_by_us(result: LoadResult) -> dict[str, Any]:
    counted: dict[str, Any] = {
        "requests": len(result.completed),
        "failed": result.failed,
        "tool": OURS,
    }
    error = result.first_error
    return {**counted, "error": error} if error else counted


def _seconds(ms: float | None) -> float | None:
    """`vllm bench serve`'s milliseconds in the report's seconds; None where it had none
    (or 0, which no real TTFT is)."""
    return (ms or 0.0) / 1000.0 or None
