"""The start-up watch (sm120/logs/fatal.py): fatal sequences trip it and name the cause;
every captured healthy start-up and the noise engines survive never trip it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120.logs.failures import load_catalogue
from sm120.logs.fatal import (
    SignatureFileError,
    StartupWatch,
    parse_signatures,
    shipped_signatures,
    watch_lines,
)
from tests.fakes.engine_logs import HEALTHY_NOISE, PREFIXES, REAL_LINES
from tests.helpers import DATA_DIR

VLLM_LOGS = DATA_DIR / "vllm_logs"
FATAL_STARTUPS = DATA_DIR / "fatal_startups"

# Captured logs in which an engine dies: the failure each one must be named by, and the line
# that shows the start is lost. Every other capture is a healthy engine and must not trip.
FATAL_CAPTURES: dict[str, tuple[str, str]] = {
    "v0.9.1_data_parallel_engine_dead.log": (
        "AttributeError: 'DPEngineCoreProc' object has no attribute 'dp_rank'",
        "EngineCore encountered a fatal error.",
    ),
    "v0.11_cpu_kv_too_small.log": (
        "F08 Long context does not fit the KV cache (estimated maximum model length too small)",
        "ValueError: To serve at least one request with the models's max seq len (40960)",
    ),
    "seed_000_glm47_errors.log": (
        "F01 FlashInfer attention crashes in prefill_wrapper.plan() on the first request",
        "    prefill_wrapper.plan(...)",
    ),
    "seed_003_nvfp4_kv.log": (
        # F07 supersedes F01, whose frame sits in the same traceback.
        "F07 Engine dies on the first request with --kv-cache-dtype nvfp4",
        "    prefill_wrapper.plan(...)",
    ),
    "vllm_0.32.0_cpu_no_cxx_compiler.log": (
        "RuntimeError: Worker failed with error 'InvalidCxxCompiler: No working C++ compiler "
        "found in torch._inductor.config.cpp.cxx: (None, '/bin/false')', please check the stack "
        "trace above for the root cause",
        "EngineCore failed to start.",
    ),
    "sglang_0.4.6_not_enough_memory.log": (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
        "[2025-06-02 09:14:58 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    ),
    "sglang_0.5.23_scheduler_died.log": (
        "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit "
        "code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i "
        "oom` to check.",
        "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9).",
    ),
}


def all_captures() -> list[Path]:
    return sorted([*VLLM_LOGS.glob("*.log"), *FATAL_STARTUPS.glob("*.log")])


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


HEALTHY = [path for path in all_captures() if path.name not in FATAL_CAPTURES]


def test_every_fatal_capture_is_in_the_data() -> None:
    names = {path.name for path in all_captures()}
    assert set(FATAL_CAPTURES) <= names
    assert len(HEALTHY) >= 30  # the vLLM corpus, 0.3 to 0.32


@pytest.mark.parametrize("path", HEALTHY, ids=lambda path: path.name)
@pytest.mark.parametrize("engine", ["vllm", "sglang", None])
def test_a_healthy_capture_never_trips(path: Path, engine: str | None) -> None:
    watch = StartupWatch(engine=engine)
    tripped = [line for line in read_lines(path) if watch.feed(line)]
    assert tripped == []
    assert watch.verdict() is None


@pytest.mark.parametrize("name", sorted(FATAL_CAPTURES))
def test_a_fatal_capture_trips_and_names_the_cause(name: str) -> None:
    described, fatal_line = FATAL_CAPTURES[name]
    path = VLLM_LOGS / name if (VLLM_LOGS / name).is_file() else FATAL_STARTUPS / name
    verdict = watch_lines(read_lines(path))
    assert verdict is not None
    assert verdict.describe() == described
    assert fatal_line in verdict.line


@pytest.mark.parametrize("line", HEALTHY_NOISE)
def test_noise_of_a_healthy_start_does_not_trip(line: str) -> None:
    assert not StartupWatch().feed(line)


SURVIVED = [
    # The API process logs a failed request's traceback under ERROR and goes on serving
    # (vLLM 0.26: chat_completion/serving.py logger.exception, renderers/params.py's message).
    "(APIServer pid=1) ERROR 11-21 00:12:03 [serving_chat.py:1210] Error in chat completion "
    "stream generator.",
    "(APIServer pid=1) ERROR 11-21 00:12:03 [serving_chat.py:1210] Traceback (most recent call "
    "last):",
    "(APIServer pid=1) ERROR 11-21 00:12:03 [serving_chat.py:1210] ValueError: This model's "
    "maximum context length is 1024 tokens.",
    # A worker's warning about its own environment.
    "(Worker pid=12315) WARNING 11-21 00:08:25 [cpu_worker.py:114] libtcmalloc is not found in "
    "LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD`",
    # The engine core's note while a worker compiles for minutes (F22, a real 0.32.0 line).
    "(EngineCore pid=11598) INFO 11-21 00:09:33 [shm_broadcast.py:871] No available shared "
    "memory broadcast block found in 60 seconds.",
    # SGLang 0.5.23 logs a configured crash-dump handler at ERROR level while it starts.
    "[2026-09-14 17:02:01] Using custom SIGQUIT handler: <function crash_dump at 0x7f>",
]


@pytest.mark.parametrize("line", SURVIVED)
def test_errors_an_engine_survives_do_not_trip(line: str) -> None:
    assert not StartupWatch().feed(line)


FATAL_CATALOGUE = sorted(mode.id for mode in load_catalogue().values() if mode.fatal)


def test_fatal_catalogue_entries_are_the_engine_killing_ones() -> None:
    engine_killing = [
        *("F01", "F02", "F03", "F04", "F07", "F07b", "F08"),
        *("F10b", "F14", "F15", "F18", "F20", "F29", "F30", "F31", "F33"),
    ]
    assert sorted(engine_killing) == FATAL_CATALOGUE
    for failure_id in FATAL_CATALOGUE:
        assert load_catalogue()[failure_id].signatures, f"{failure_id} is fatal but unmatched"


@pytest.mark.parametrize(
    "failure_id,line",
    [(failure_id, line) for failure_id, lines in REAL_LINES.items() for line in lines],
)
def test_a_catalogue_line_trips_exactly_when_its_entry_is_fatal(failure_id: str, line: str) -> None:
    watch = StartupWatch()
    assert watch.feed(line) is (failure_id in FATAL_CATALOGUE)
    verdict = watch.verdict()
    if failure_id in FATAL_CATALOGUE:
        assert verdict is not None and verdict.failure is not None
        assert verdict.failure.id == failure_id


# The wording of each engine line in startup_fatal.yaml, as the engine's source writes it
# (releases in the file's `source`), behind the prefix the engine puts in front.
ENGINE_LINES = {
    r"EngineCore failed to start\.": "(EngineCore_DP0 pid=276) ERROR 09-24 13:00:49 "
    "[core.py:1330] EngineCore failed to start.",
    r"EngineCore encountered a fatal error\.": "(EngineCore_0 pid=2651) ERROR 06-11 11:46:39 "
    "[core.py:517] EngineCore encountered a fatal error.",
    r"Engine core initialization failed\.": "(APIServer pid=1) RuntimeError: Engine core "
    "initialization failed. See root cause above. Failed core proc(s): {}",
    "Worker failed with error '": "(EngineCore pid=11598) ERROR 11-21 00:09:10 [core.py:1330] "
    "RuntimeError: Worker failed with error 'CppCompileError: C++ compile error', please "
    "check the stack trace above for the root cause",
    r"WorkerProc (?:failed to start|failed)\.": "(Worker_TP0 pid=3) ERROR 11-20 10:00:00 "
    "[multiproc_executor.py:901] WorkerProc failed to start.",
    "WorkerProc initialization failed due to an exception": "(EngineCore_DP0 pid=2) ERROR "
    "Exception: WorkerProc initialization failed due to an exception in a background process. "
    "See stack trace for root cause.",
    r"\(EngineCore[\w ]*pid=\d+\)\s.*\bERROR\b.*Traceback \(most recent call last\):": (
        "(EngineCore_DP0 pid=2) ERROR 11-20 10:00:00 [core.py:1330] Traceback (most recent call "
        "last):"
    ),
    "(?:Scheduler|TpModelWorkerClient|DetokenizerManager|TokenizerManager|"
    "DataParallelController) hit an exception:": "[2025-06-02 09:14:58 TP0] Scheduler hit an "
    "exception: Traceback (most recent call last):",
    r"Received sigquit from a child process\. It usually means the child failed\.": (
        "[2025-06-02 09:14:58] Received sigquit from a child process. It usually means the "
        "child failed."
    ),
    r"Rank \d+ scheduler (?:is dead|died during initialization)": "[2025-05-20 10:00:00] Rank 0 "
    "scheduler is dead. Please check if there are relevant logs.",
    r"Initialization failed\. (?:Please see the error messages above|warmup error:)": (
        "[2025-05-20 10:03:00] Initialization failed. warmup error: Traceback (most recent call "
        "last):"
    ),
    r"Subprocess \S+ \(pid=\d+\) crashed with exit code": "[2026-09-14 17:03:40] Subprocess "
    "scheduler_0 (pid=812) crashed with exit code -9. Triggering SIGQUIT for cleanup...",
}


def test_every_engine_signature_has_its_line_here() -> None:
    assert sorted(entry.signature for entry in shipped_signatures()) == sorted(ENGINE_LINES)


@pytest.mark.parametrize("signature", sorted(ENGINE_LINES))
@pytest.mark.parametrize("prefix", PREFIXES)
def test_an_engine_line_trips_behind_any_prefix(signature: str, prefix: str) -> None:
    engine = next(entry.engine for entry in shipped_signatures() if entry.signature == signature)
    line = prefix + ENGINE_LINES[signature]
    assert StartupWatch(engine=engine).feed(line)
    other = "sglang" if engine == "vllm" else "vllm"
    if "EngineCore" not in prefix:  # an engine core's ERROR prefix makes any line vLLM's
        assert not StartupWatch(engine=other).feed(line)


def test_the_error_after_the_fatal_line_names_it() -> None:
    verdict = watch_lines(
        [
            "(EngineCore pid=7) ERROR 11-21 00:09:10 [core.py:1330] EngineCore failed to start.",
            "(EngineCore pid=7) ERROR 11-21 00:09:10 [core.py:1330] Traceback (most recent "
            "call last):",
            '(EngineCore pid=7) ERROR 11-21 00:09:10 [core.py:1330]   File "core.py", line 9',
            "(EngineCore pid=7) ERROR 11-21 00:09:10 [core.py:1330] torch.OutOfMemoryError: CUDA "
            "out of memory. Tried to allocate 1.74 GiB.",
            "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause "
            "above. Failed core proc(s): {}",
        ]
    )
    assert verdict is not None and verdict.failure is None
    assert verdict.line.endswith("EngineCore failed to start.")
    assert verdict.describe() == (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB."
    )


def test_a_wrapper_that_points_above_is_named_by_the_error_before_it() -> None:
    verdict = watch_lines(
        [
            "KeyError: 'model.layers.0.mlp.experts.w13_weight'",
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
            "proc(s): {}",
        ]
    )
    assert verdict is not None
    assert verdict.describe() == "KeyError: 'model.layers.0.mlp.experts.w13_weight'"


def test_without_an_exception_the_fatal_line_is_named_without_its_header() -> None:
    verdict = watch_lines(
        ["(EngineCore pid=7) ERROR 11-21 00:09:10 [core.py:1330] EngineCore failed to start."]
    )
    assert verdict is not None
    assert verdict.describe() == "EngineCore failed to start."


def test_a_long_error_is_cut_to_one_readable_line() -> None:
    verdict = watch_lines(["EngineCore failed to start.", "RuntimeError: " + "x" * 500])
    assert verdict is not None
    assert len(verdict.describe()) == 300 and verdict.describe().endswith("…")


def test_the_watch_trips_once() -> None:
    watch = StartupWatch()
    line = "EngineCore failed to start."
    assert [watch.feed(line), watch.feed(line), watch.feed("Worker failed with error 'x'")] == [
        True,
        False,
        False,
    ]


@pytest.mark.parametrize(
    "text,message",
    [
        ("- engine: vllm\n", "startup_fatal.yaml: entry 0.signature: Field required"),
        (
            "- {engine: tgi, signature: x, source: s, note: n}\n",
            "startup_fatal.yaml: entry 0.engine: Input should be 'vllm' or 'sglang'",
        ),
        (
            "- {engine: vllm, signature: '(', source: s, note: n}\n",
            "startup_fatal.yaml: entry 0.signature: Value error, signature '(' is not a valid "
            "regex: missing ), unterminated subpattern at position 0",
        ),
        (
            "- {engine: vllm, signature: x, source: s, note: n, fatal: true}\n",
            "startup_fatal.yaml: entry 0.fatal: Extra inputs are not permitted",
        ),
        ("- [unclosed\n", "startup_fatal.yaml: malformed YAML: while parsing a flow sequence"),
    ],
)
def test_a_broken_signature_file_is_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(SignatureFileError) as caught:
        parse_signatures(text)
    assert caught.value.message == message
