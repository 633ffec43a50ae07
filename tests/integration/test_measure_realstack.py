"""bench, test gates and eval against a real vLLM (CPU build) serving the tiny model.

One server for the module, started the way a user would: `sm120 launch tiny` with n-gram
speculative decoding (so /metrics has real draft counters) and the hermes tool parser (so
tool requests are accepted). The model's words are gibberish: these tests check that its
gates check what a random model can show (and that served as a real model its noise fails),
that the harness times what it sees sanely, and that it runs the real `vllm bench serve` -
not that the model is clever.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port, port_is_free
from tests.integration.realstack import engine_processes, sm120, state_of, wait_for

pytestmark = pytest.mark.integration

SPECULATIVE = (
    '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, engine_python: Path) -> Path:
    from sm120.engine.tiny_model import ensure_tiny_model

    return ensure_tiny_model(engine_python, tmp_path_factory.mktemp("models") / "tiny", print)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("home")
    port = free_port()
    launched = sm120(
        home, "launch", "tiny", "--port", str(port), "--model-dir", str(tiny_model),
        "--set", f"speculative-config={SPECULATIVE}",
        "--set", "enable-auto-tool-choice=true",
        "--set", "tool-call-parser=hermes",
        # the dev routes give the bench test a /reset_prefix_cache (see reset_prefix_cache)
        "--set", "env.VLLM_SERVER_DEV_MODE=1",
        timeout=1500,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-3000:]
    try:
        yield {"home": home, "port": port}
    finally:
        sm120(home, "stop")


def run_json(home: Path, *args: str, timeout: float = 900) -> tuple[int, dict[str, Any], str]:
    result = sm120(home, *args, "--json", timeout=timeout)
    try:
        data = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"no JSON (exit {result.returncode}): {result.stderr[-3000:]}")
    return result.returncode, data, result.stderr


def reset_prefix_cache(home: Path) -> None:
    """Empty the server's prefix cache. Prompt starts are drawn from the tiny model's 506
    ids, so a run can meet a block an earlier `vllm bench serve` run left cached (a CI run
    met one); emptied, any hit left is a repeat of our own. A dev-mode route: the ward keeps
    it off the deployment's port, so it goes to the engine's own socket."""
    socket_path = (state_of(home) or {})["engine_socket"]
    engine = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), base_url="http://e")

    def reset() -> bool:
        # success false while a request still holds blocks: the run before may not have drained
        return bool(engine.post("/reset_prefix_cache", timeout=10).json().get("success"))

    with engine:
        wait_for("the prefix cache reset", reset, 30)


def sane_seconds(value: float | None, upper: float = 120.0) -> bool:
    return value is not None and 0.0 < value < upper


# --- bench ------------------------------------------------------------------------------------


def test_bench_with_vllm_bench_serve(served: dict[str, Any]) -> None:
    home = served["home"]
    code, report, err = run_json(
        home, "bench", "--lengths", "128,512", "--concurrency", "1,2",
        "--decode-tokens", "64", "--requests", "2",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    assert report["tools"]["vllm bench serve"].startswith("engine venv ")
    # runs compare by where the engine ran and the plan hash (flags, env, model): a native
    # run names no image (the plan's is for container runs)
    plan_hash = state_of(home)["plan_hash"]  # type: ignore[index]
    assert report["key"] == f"native|{plan_hash}"
    assert (report["image"], report["runtime"]) == (None, "native")
    assert report["max_model_len"] == 1024
    decode = report["decode"]
    assert decode["tool"] == "vllm bench serve" and decode["failed"] == 0
    # no upper bound: the CPU build often sends short-prompt streams in one burst, which
    # makes any streamed decode rate (vLLM's too) arbitrarily high
    assert decode["tps"] > 1.0
    for point in report["prefill"]:
        assert point["tool"] == "sm120" and point["failed"] == 0
        assert sane_seconds(point["ttft_s"])
        assert len(point["ttfts_ms"]) == point["requests"]
        assert point["prefill_tps"] == pytest.approx(
            point["prompt_tokens"] / point["ttft_s"], rel=0.3
        )
    assert [p["prompt_tokens"] for p in report["prefill"]] == [128, 512]
    for level in report["concurrency"]:
        assert level["tool"] == "vllm bench serve"
        assert level["requests"] == max(4, 2 * level["concurrency"]) and level["failed"] == 0
        assert level["aggregate_tps"] > 0 and level["per_request_tps"] > 0
    # n-gram speculation: up to three draft tokens per draft, counted by the server itself
    spec = report["spec_decode"]
    assert spec["tool"] == "/metrics counters"
    assert spec["drafts"] > 0 and spec["drafts"] <= spec["draft_tokens"] <= 3 * spec["drafts"]
    assert 0.0 <= spec["acceptance_rate"] <= 1.0
    # the plan's speculative decoding (set with --set) travels to the report, typed
    assert report["speculative"] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "model": None,
        "options": {"prompt_lookup_max": 3, "prompt_lookup_min": 1},
    }
    # the raw --save-result documents stay next to the history
    saved = sorted(p.name for p in Path(report["result_dir"]).glob("*.json"))
    assert saved == ["c1.json", "c2.json", "decode.json"]
    assert json.loads((Path(report["result_dir"]) / "c2.json").read_text())["max_concurrency"] == 2
    history = (home / "bench" / "history.jsonl").read_text().splitlines()
    assert json.loads(history[-1])["key"] == report["key"]


def test_monitor_reads_acceptance_against_the_plan(served: dict[str, Any]) -> None:
    """The monitor started by launch scrapes the real /metrics; after the bench above moved
    the draft counters, its live view names the plan's method and draft length."""
    deadline = time.monotonic() + 60
    live: dict[str, Any] = {}
    while time.monotonic() < deadline:
        result = sm120(served["home"], "monitor", "--json")
        live = json.loads(result.stdout) if result.returncode == 0 else {}
        if live.get("speculative"):
            break
        time.sleep(2)
    assert live["speculative"] == {"method": "ngram", "num_speculative_tokens": 3}
    once = sm120(served["home"], "monitor", "--once")
    assert "/4 ngram)" in once.stdout, once.stdout


def test_bench_everything_by_vllm_and_everything_by_us(served: dict[str, Any]) -> None:
    home = served["home"]
    code, theirs, err = run_json(
        home, "bench", "--tool", "vllm", "--quick", "--lengths", "256",
        "--decode-tokens", "64", "--requests", "2", "--no-save",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    assert theirs["prefill"][0]["tool"] == "vllm bench serve"
    assert sane_seconds(theirs["prefill"][0]["ttft_s"])
    reset_prefix_cache(served["home"])
    code, ours, err = run_json(
        home, "bench", "--tool", "ours", "--quick", "--lengths", "256",
        "--decode-tokens", "64", "--requests", "2", "--no-save",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    assert ours["decode"]["tool"] == "sm120"
    # built as vllm bench serve's random dataset builds them, from the tokenizer.json the
    # engine loaded: the tiny model's 512 ids (6 of them special)
    assert ours["tools"] == {
        "vllm bench serve": "not used (--tool ours)",
        "sm120": "aiohttp, streamed /v1/completions, text prompts of exact token lengths, "
        "built as vllm bench serve --dataset-name random builds them (runs of consecutive "
        "ids over the tokenizer's 512-id vocabulary)",
    }
    # every prompt's text tokenized back to its exact length on the real tokenizer
    assert not any("token ids" in note for note in ours["notes"])
    assert ours["decode"]["tps"] > 1.0 and 0 <= ours["decode"]["bursty"] <= 2
    # bursts are named in the notes (how far the two tools agree is measured by
    # benchmarks/bench_vs_vllm.py, not asserted here)
    assert bool(ours["decode"]["bursty"]) == any("in bursts" in n for n in ours["notes"])
    assert sane_seconds(ours["prefill"][0]["ttft_s"])
    # vLLM's own counters: every prompt we sent was queried, none was served from the cache
    # (runs of consecutive ids, as vLLM's, but no two of them from the same start; the cache
    # was emptied before the run, so a hit can only be one of ours repeated)
    cache = ours["prefix_cache"]
    assert cache["tool"] == "/metrics counters" and cache["hit_tokens"] == 0
    assert cache["queried_tokens"] >= 2 * 64 + 3 * 256  # decode, warm-up and measured prompts
    decode = ours["decode"]
    if decode["bursty"] == 0:  # the figure over every stream is the figure
        assert decode["tps_all_requests"] == pytest.approx(decode["tps"])
    else:
        assert decode["tps_all_requests"] > 1.0


# --- gates ------------------------------------------------------------------------------------


def test_core_gate_on_the_random_model_checks_what_it_can_show(served: dict[str, Any]) -> None:
    code, data, err = run_json(served["home"], "test", "core", "--max-tokens", "16")
    assert code == 0, err[-2000:]
    assert data["ok"] is True
    report = data["suites"][0]
    assert (report["passed"], report["failed"]) == (9, 0)
    assert "no case can show correctness" in report["random_model"]
    for case in report["cases"]:
        assert not case["failures"], case
        for turn in case["turns"]:
            assert 0 < turn["completion_tokens"] <= 16
            assert turn["prompt_tokens"] > 10
            assert sane_seconds(turn["ttft_s"], 60)
            assert turn["finish_reason"] in ("length", "stop")
    multi = next(c for c in report["cases"] if c["id"] == "multi-turn-memory")
    assert len(multi["turns"]) == 2
    assert multi["turns"][1]["prompt_tokens"] > multi["turns"][0]["prompt_tokens"]


def test_uncapped_answer_runs_to_the_context_limit_or_eos(served: dict[str, Any]) -> None:
    code, data, _ = run_json(served["home"], "test", "core", "--case", "math-multiply")
    assert code == 0
    turn = data["suites"][0]["cases"][0]["turns"][0]
    assert turn["finish_reason"] in ("length", "stop")
    assert turn["prompt_tokens"] + turn["completion_tokens"] <= 1024
    assert turn["decode_tps"] > 0


def test_tools_gate_reaches_both_apis(served: dict[str, Any]) -> None:
    code, data, _ = run_json(served["home"], "test", "tools", "--max-tokens", "24")
    cases = {c["id"]: c for c in data["suites"][0]["cases"]}
    chat, messages = cases["chat-tool-call"], cases["messages-tool-use"]
    # A random model makes no tool call: each API is checked for an answer it can give.
    for case in (chat, messages):
        assert not any("request failed" in f for f in case["failures"]), case["failures"]
        assert case["turns"][0]["prompt_tokens"] > 0
    assert messages["api"] == "messages"
    assert code == (1 if chat["failures"] or messages["failures"] else 0)


def test_long_gate_fills_the_plan_context(served: dict[str, Any]) -> None:
    code, data, _ = run_json(
        served["home"], "test", "long", "--case", "needle-middle", "--max-tokens", "16"
    )
    assert code == 0
    turn = data["suites"][0]["cases"][0]["turns"][0]
    assert not turn["failures"], turn["failures"]
    assert 500 < turn["prompt_tokens"] <= 1024 - 16  # most of the room, never over


def test_eval_dry_run_uses_the_served_checkpoint(served: dict[str, Any], tiny_model: Path) -> None:
    result = sm120(served["home"], "eval", "gsm8k", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"tokenizer={tiny_model}" in result.stdout
    assert "max_length=1024" in result.stdout
    assert f"base_url=http://127.0.0.1:{served['port']}/v1/completions" in result.stdout


@pytest.fixture(scope="module")
def served_agent(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path
) -> Iterator[dict[str, Any]]:
    """The agent quickstart's deployment (tiny -V agent), at 4,096 tokens: tiny's template
    renders the session's four tools into the prompt, which the default 1,024 cannot hold."""
    home = tmp_path_factory.mktemp("home-agent")
    port = free_port()
    launched = sm120(
        home, "launch", "tiny", "-V", "agent", "--port", str(port),
        "--model-dir", str(tiny_model), "--set", "max-model-len=4096", "--no-monitor",
        timeout=1500,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-3000:]
    try:
        yield {"home": home, "port": port}
    finally:
        sm120(home, "stop")


def test_agent_session_protocol_and_prefix_reuse(served_agent: dict[str, Any]) -> None:
    """Two turns of the agent session on both APIs: every answer's protocol is checked, the
    tool forced and marked strict (random weights choose no tool); turn 2 answers turn 1's
    call, so its prompt starts with turn 1's and vLLM's counters must show the cache serving
    it."""
    served = served_agent
    code, data, err = run_json(
        served["home"], "test", "agent", "--turns", "2", "--max-tokens", "32"
    )
    assert code == 0, (err[-2000:], json.dumps(data)[:3000])
    report = data["suites"][0]
    assert (report["suite"], report["mode"], report["failed"]) == ("agent", "protocol", 0)
    sessions = {case["api"]: case for case in report["cases"]}
    assert set(sessions) == {"messages", "chat"}
    for api, session in sessions.items():
        first, second = session["turns"]
        for turn, tool in ((first, "Read"), (second, "Edit")):
            assert turn["tool_choice"] == tool and turn["failures"] == [], (api, turn)
            assert [call["name"] for call in turn["tool_calls"]] == [tool]
            assert turn["tool_calls"][0]["id"]
            assert 0 < turn["completion_tokens"] <= 32
        # turn 2 carries turn 1's prompt, the call and its result: longer, mostly cached
        assert second["prompt_tokens"] > first["prompt_tokens"] + 50
        cache = second["prefix_cache"]
        assert cache["queried_tokens"] >= second["prompt_tokens"] - 1
        assert cache["hit_rate"] > 0.5, cache
    total = report["prefix_cache"]
    assert total["hit_tokens"] == sum(s["prefix_cache"]["hit_tokens"] for s in sessions.values())
    # status reads the same counters, since the server started
    code, rows, err = run_json(served["home"], "status")
    assert code == 0, err
    assert 0.0 < rows[0]["prefix_cache_hit_pct"] <= 100.0
    assert rows[0]["prefix_cache_queried_tokens"] >= total["queried_tokens"]


def test_agent_session_on_tinys_default_context_is_refused_before_a_turn(
    served: dict[str, Any],
) -> None:
    """tiny's template renders the session's four tools: its first turn alone is more than
    the default 1,024 tokens, which the real engine's /tokenize counts (tools included)."""
    result = sm120(served["home"], "test", "agent", "--api", "chat", "--max-tokens", "32")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert (result.returncode, result.stdout, len(lines)) == (2, "", 1), result.stderr[-2000:]
    assert lines[0].startswith(
        "Error: the agent session does not fit tiny's 1,024-token context: its first turn is "
    )
    assert lines[0].endswith(
        "prompt tokens (the 4 tools rendered by the chat template) and 32 to answer (hint: "
        "launch the variant sized for agents: sm120 launch tiny -V agent)"
    )


# --- launch --gate ----------------------------------------------------------------------------


def test_launch_gate_failure_stops_the_server(tmp_path: Path, tiny_model: Path) -> None:
    home, port = tmp_path / "home", free_port()
    result = sm120(
        home, "launch", "tiny", "--port", str(port), "--model-dir", str(tiny_model),
        "--gate", "core", "--gate-max-tokens", "8",
        # Taken for a real model: its gates then expect right answers, and its noise fails.
        "--set", "model.generated=null",
        timeout=1500,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert "READY" not in result.stdout
    assert "FAIL core/math-multiply" in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("Error: the gate failed (core 9 of 9 cases failed); the server was stopped")
    )
    deadline = time.monotonic() + 30
    while engine_processes(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert engine_processes(port) == []
    assert port_is_free(port)
    assert state_of(home) is None
