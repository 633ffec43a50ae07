"""`sm120 eval gsm8k`: the lm-evaluation-harness command it runs (never installed in CI), the
missing-extra error, and result parsing through a stand-in `lm_eval` module."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.measure import lmeval
from sm120.measure.target import Target, run_with_api_key
from tests.fakes.openai_server import FakeOpenAIServer
from tests.helpers import invoke

KEY = "sk-eval-secret"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAIServer]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeOpenAIServer(api_key=KEY, model="glm-5.2", max_model_len=131_072) as scripted:
        yield scripted


def test_dry_run_prints_the_harness_command(server: FakeOpenAIServer, cli: CliRunner) -> None:
    code, out, err = invoke(
        cli, "eval", "gsm8k", "--url", server.url, "--output", "/tmp/ev", "--dry-run"
    )
    assert code == 0, err
    assert shlex.split(out) == [
        sys.executable, "-m", "lm_eval",
        "--model", "local-completions",
        "--model_args",
        f"model=glm-5.2,base_url={server.url}/v1/completions,num_concurrent=4,max_retries=3,"
        "tokenized_requests=False,tokenizer_backend=remote,max_length=131072",
        "--tasks", "gsm8k",
        "--num_fewshot", "5",
        "--batch_size", "1",
        "--seed", "1234",
        "--output_path", "/tmp/ev",
        "--limit", "200",
    ]  # fmt: skip
    assert KEY not in out


def test_dry_run_chat_api_all_problems(
    server: FakeOpenAIServer, cli: CliRunner, tmp_path: Path
) -> None:
    code, out, _ = invoke(
        cli, "eval", "gsm8k", "--url", server.url, "--api", "chat", "--limit", "0",
        "--fewshot", "8", "--concurrency", "2", "--output", str(tmp_path), "--dry-run",
    )  # fmt: skip
    argv = shlex.split(out)
    assert code == 0
    assert argv[argv.index("--model") + 1] == "local-chat-completions"
    model_args = argv[argv.index("--model_args") + 1]
    assert f"base_url={server.url}/v1/chat/completions" in model_args
    assert "num_concurrent=2" in model_args and "tokenizer" not in model_args
    assert argv[-2:] == ["--apply_chat_template", "--fewshot_as_multiturn"]
    assert "--limit" not in argv
    assert argv[argv.index("--num_fewshot") + 1] == "8"


def test_local_checkpoint_is_the_tokenizer(tmp_path: Path) -> None:
    from sm120.measure.target import Target

    target = Target("d", "http://127.0.0.1:8000", None, "tiny", str(tmp_path), 1024)
    argv = lmeval.lm_eval_command(target, lmeval.EvalSettings(), tmp_path / "out")
    model_args = argv[argv.index("--model_args") + 1]
    assert f"tokenizer_backend=huggingface,tokenizer={tmp_path}" in model_args


def test_the_plans_repo_is_the_tokenizer_when_the_folder_is_elsewhere() -> None:
    from sm120.measure.target import Target

    target = Target(
        "d", "http://127.0.0.1:8000", None, "glm-5.2", "/mnt/in/container", 250_000,
        model_repo="0xSero/GLM-5.2-NVFP4-REAP-469B",
    )  # fmt: skip
    argv = lmeval.lm_eval_command(target, lmeval.EvalSettings(), Path("/tmp/out"))
    model_args = argv[argv.index("--model_args") + 1]
    assert "tokenizer_backend=huggingface,tokenizer=0xSero/GLM-5.2-NVFP4-REAP-469B" in model_args


def test_missing_lm_eval_is_one_line(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, server: FakeOpenAIServer
) -> None:
    monkeypatch.setattr(lmeval, "lm_eval_available", lambda: False)
    code, out, err = invoke(cli, "eval", "gsm8k", "--url", server.url)
    assert (code, out) == (2, "")
    assert err == (
        "Error: lm-evaluation-harness (lm_eval) is not installed "
        "(hint: install the extra: pip install 'sm120[eval]')\n"
    )
    assert server.requests == []  # nothing was asked of the server


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--api", "rest"], "Error: unknown --api 'rest' (hint: use completions or chat)"),
        (
            ["--limit", "-1"],
            "Error: --limit must be 0 or more, got -1 (hint: 0 asks every problem)",
        ),
        (
            ["--concurrency", "0"],
            "Error: --concurrency must be 1 or more, got 0 (hint: e.g. 4)",
        ),
        (
            ["--min-score", "94"],
            "Error: --min-score must be 1 or less, got 94 (hint: e.g. 0.94)",
        ),
    ],
)
def test_bad_options(cli: CliRunner, args: list[str], message: str) -> None:
    code, _, err = invoke(cli, "eval", "gsm8k", *args, "--dry-run")
    assert (code, err.strip()) == (2, message)


STAND_IN = """
import json, os, sys, pathlib
argv = sys.argv[1:]
out = pathlib.Path(argv[argv.index("--output_path") + 1]) / "glm-5.2"
out.mkdir(parents=True, exist_ok=True)
print("stand-in lm_eval; key in env:", os.environ.get("OPENAI_API_KEY") == "sk-eval-secret")
results = {"results": {"gsm8k": {
    "alias": "gsm8k",
    "exact_match,strict-match": 0.94, "exact_match_stderr,strict-match": 0.0168,
    "exact_match,flexible-extract": 0.965, "exact_match_stderr,flexible-extract": 0.013,
}}}
(out / "results_2026-11-21T00-00-00.json").write_text(json.dumps(results))
sys.exit(int(os.environ.get("STAND_IN_EXIT", "0")))
"""


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "fake_site" / "lm_eval"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    return tmp_path / "results"


def test_scores_are_read_back_and_checked(
    server: FakeOpenAIServer, cli: CliRunner, stand_in: Path
) -> None:
    code, out, err = invoke(
        cli, "eval", "gsm8k", "--url", server.url, "--output", str(stand_in), "--json",
        "--min-score", "0.95",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data["scores"] == {
        "exact_match,strict-match": 0.94,
        "exact_match,flexible-extract": 0.965,
    }
    assert "key in env: True" in err  # the harness got the key, not argv
    code, _, err = invoke(
        cli, "eval", "gsm8k", "--url", server.url, "--output", str(stand_in),
        "--min-score", "0.97",
    )  # fmt: skip
    assert code == 1
    assert "exact_match,flexible-extract 0.965 is below --min-score 0.97" in err


def test_harness_failure(
    server: FakeOpenAIServer,
    cli: CliRunner,
    stand_in: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STAND_IN_EXIT", "3")
    code, _, err = invoke(cli, "eval", "gsm8k", "--url", server.url, "--output", str(stand_in))
    assert code == 2
    assert err.strip().endswith("Error: lm_eval exited with code 3 (hint: see its output above)")


# Flushed after each line so the merged order is fixed even when stdout is a buffered pipe.
ECHO_KEY = (
    "import os, sys; key = os.environ.get('OPENAI_API_KEY', '<none>'); "
    "print('key=' + key + '  ', flush=True); "
    "print('to stderr', file=sys.stderr, flush=True); sys.exit(4)"
)


def test_tool_runner_hands_the_key_only_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "inherited-key")
    lines: list[str] = []
    code = run_with_api_key([sys.executable, "-c", ECHO_KEY], None, lines.append)
    assert (code, lines) == (4, ["key=<none>", "to stderr"])  # ours is not passed on
    lines.clear()
    assert run_with_api_key([sys.executable, "-c", ECHO_KEY], KEY, lines.append) == 4
    assert lines == [f"key={KEY}", "to stderr"]  # unmasked: each caller masks what it shows


def test_lm_eval_output_has_the_key_masked() -> None:
    target = Target("t", "http://127.0.0.1:9", KEY, "m", None, None)
    lines: list[str] = []
    assert lmeval.run_lm_eval([sys.executable, "-c", ECHO_KEY], target, lines.append) == 4
    assert lines == ["key=***", "to stderr"]


def test_no_results_file(tmp_path: Path) -> None:
    with pytest.raises(lmeval.EvalError) as caught:
        lmeval.latest_results(tmp_path)
    assert caught.value.one_line() == (
        f"lm_eval wrote no results under {tmp_path} (hint: see its output above for the cause)"
    )
