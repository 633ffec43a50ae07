"""lm-evaluation-harness against the deployment's endpoint (the optional `eval` extra).

The seeds validate builds with GSM8K through the OpenAI-compatible API: 5-shot, a 200-problem
limit, a few requests at a time, /v1/completions (seed 001 floors: 0.94 flexible, 0.925
strict). The harness reads the API key from OPENAI_API_KEY, so it never appears in argv.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sm120.core.errors import SM120Error
from sm120.measure.target import Target, run_with_api_key
from sm120.server.transport import mask_secret

INSTALL_HINT = "install the extra: pip install 'sm120[eval]'"
Api = Literal["completions", "chat"]


class EvalError(SM120Error):
    """The evaluation could not run or produced no result."""


@dataclass(frozen=True)
class EvalSettings:
    task: str = "gsm8k"
    fewshot: int = 5
    limit: int | None = 200
    concurrency: int = 4
    api: Api = "completions"
    seed: int = 1234


def lm_eval_available() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


def require_lm_eval() -> None:
    if not lm_eval_available():
        raise EvalError("lm-evaluation-harness (lm_eval) is not installed", INSTALL_HINT)


def lm_eval_command(
    target: Target, settings: EvalSettings, output_dir: Path, python: str = sys.executable
) -> list[str]:
    """The harness invocation; a list for subprocess, never a shell string."""
    path = "/v1/completions" if settings.api == "completions" else "/v1/chat/completions"
    model_args = [
        f"model={target.model}",
        f"base_url={target.base_url}{path}",
        f"num_concurrent={settings.concurrency}",
        "max_retries=3",
        "tokenized_requests=False",
    ]
    if settings.api == "completions":
        # The prompt goes as text; the harness only measures it with a tokenizer: the served
        # checkpoint folder when it is on this machine, else the plan's Hugging Face repo,
        # else the server's own (remote backend, newer lm-eval and servers that offer it).
        if target.model_root and Path(target.model_root).is_dir():
            model_args += ["tokenizer_backend=huggingface", f"tokenizer={target.model_root}"]
        elif target.model_repo:
            model_args += ["tokenizer_backend=huggingface", f"tokenizer={target.model_repo}"]
        else:
            model_args.append("tokenizer_backend=remote")
        if target.max_model_len:
            model_args.append(f"max_length={target.max_model_len}")
    harness_model = (
        "local-completions" if settings.api == "completions" else "local-chat-completions"
    )
    argv = [
        python, "-m", "lm_eval",
        "--model", harness_model,
        "--model_args", ",".join(model_args),
        "--tasks", settings.task,
        "--num_fewshot", str(settings.fewshot),
        "--batch_size", "1",
        "--seed", str(settings.seed),
        "--output_path", str(output_dir),
    ]  # fmt: skip
    if settings.api == "chat":
        argv += ["--apply_chat_template", "--fewshot_as_multiturn"]
    if settings.limit is not None:
        argv += ["--limit", str(settings.limit)]
    return argv


def run_lm_eval(argv: list[str], target: Target, on_line: Callable[[str], object]) -> int:
    return run_with_api_key(
        argv, target.api_key, lambda line: on_line(mask_secret(line, target.api_key))
    )


def latest_results(output_dir: Path) -> dict[str, Any]:
    """The newest results_*.json the harness wrote under output_dir."""
    found = sorted(output_dir.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise EvalError(
            f"lm_eval wrote no results under {output_dir}", "see its output above for the cause"
        )
    data = json.loads(found[-1].read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise EvalError(f"{found[-1]} is not a results document", "")
    return data


def scores(results: dict[str, Any], task: str) -> dict[str, float]:
    """metric,filter -> value for one task, e.g. 'exact_match,flexible-extract': 0.965."""
    section = (results.get("results") or {}).get(task)
    if not isinstance(section, dict):
        raise EvalError(f"the results have no '{task}' section", "check the task name")
    return {
        key: float(value)
        for key, value in section.items()
        if "," in key and "_stderr" not in key and isinstance(value, (int, float))
    }
