"""`sm120 test`: pass paths against a scripted server that knows the answers, and each way a
case fails (wrong answer, F12, F27, F05, F06, garbage, HTTP errors)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.measure.cases import Check, builtin_gates, parse_gate_file, select
from sm120.measure.gates import GateOptions, document_budget, run_cases
from sm120.measure.judge import judge
from sm120.measure.target import target_for_url
from sm120.server.wire import Exchange, ToolCall
from tests.fakes.openai_server import FakeOpenAIServer, Reply, ScriptedTool
from tests.helpers import invoke

THINK = "Let me work through this carefully."
WEATHER = ScriptedTool("get_weather", {"city": "Paris", "unit": "celsius"})

# A model that knows every built-in answer (and reasons first, like GLM-5.2).
KNOWN_ANSWERS = [
    (r"youngest", "Cleo"),
    (r"bloops", "Yes. Every bloop is a razzy and every razzy is a lazzy."),
    (r"17 multiplied by 23", "391"),
    (r"train travels", "40"),
    (r"Is 91 a prime", "No. 91 = 7 x 13, so it has factors other than 1 and itself."),
    (
        r"is_palindrome",
        "```python\ndef is_palindrome(s):\n    s = s.lower()\n    return s == s[::-1]\n```",
    ),
    (r"Ship of Theseus", "If every plank of a ship is replaced, is it still the same ship?"),
    (r"triangle of asterisks", "```\n*\n**\n***\n****\n```"),
    (r"remember this", "OK"),
    (r"How old will my cat", "Pixel will be 10 years old."),
    (r"copper vault", "7493"),
    (r"harbour pilot", "1) Orrin Vale\n2) green\n3) 8152 sacks"),
    (r"blue locker code\?", "4817"),
    (r"ferry to Marlow", "14:35"),
    (r"badge number\?", "3092"),
    (r"spare key", "Under the green watering can."),
    (r"Tarn Street", "275"),
    (r"Add the blue locker", "7909"),
]


def knowing_server(**kwargs: object) -> FakeOpenAIServer:
    server = FakeOpenAIServer(model="scripted", **kwargs)  # type: ignore[arg-type]
    for pattern, content in KNOWN_ANSWERS:
        server.when(pattern, Reply(content=content, reasoning=THINK, token_delay=0.002))
    server.when(r"weather in Paris", Reply(tool_calls=(WEATHER,)))
    return server


@pytest.fixture
def knowing() -> Iterator[FakeOpenAIServer]:
    with knowing_server(api_key="sk-scripted-secret", max_model_len=200_000) as server:
        yield server


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-scripted-secret")


def run_suite(server: FakeOpenAIServer, suite: str, **options: object) -> dict[str, object]:
    target = target_for_url(server.url, None)
    cases = select(builtin_gates(), suite)
    return run_cases(target, suite, cases, GateOptions(**options))  # type: ignore[arg-type]


# --- pass paths -----------------------------------------------------------------------------


@pytest.mark.parametrize("suite", ["core", "long", "multiturn", "tools"])
def test_every_builtin_suite_passes_against_a_model_that_knows(
    knowing: FakeOpenAIServer, keyed: None, suite: str
) -> None:
    report = run_suite(knowing, suite)
    failures = [case["failures"] for case in report["cases"]]  # type: ignore[index]
    assert report["failed"] == 0, failures
    assert report["passed"] == len(builtin_gates().suites[suite].cases)


def test_cli_core_passes_and_prints_one_line_per_case(
    knowing: FakeOpenAIServer, keyed: None, cli: CliRunner
) -> None:
    code, out, err = invoke(cli, "test", "core", "--url", knowing.url)
    assert code == 0, out + err
    lines = out.strip().splitlines()
    assert len([line for line in lines if line.startswith("PASS core/")]) == 9
    assert lines[-1] == "core: 9/9 cases passed - passed"
    assert "sk-scripted-secret" not in out + err


def test_streamed_without_max_tokens_and_timed(knowing: FakeOpenAIServer, keyed: None) -> None:
    report = run_suite(knowing, "core")
    chat_bodies = [body for path, body in knowing.requests if path == "/v1/chat/completions"]
    assert chat_bodies and all(body["stream"] is True for body in chat_bodies)
    assert all("max_tokens" not in body for body in chat_bodies)
    turn = report["cases"][5]["turns"][0]  # type: ignore[index]
    assert turn["prompt_tokens"] > 10
    assert 0 < turn["ttft_s"] < 5
    # 0.002 s between pieces: well under 500 tok/s, and far above a stalled stream.
    assert 20 < turn["decode_tps"] < 520
    assert turn["prefill_tps"] == pytest.approx(turn["prompt_tokens"] / turn["ttft_s"])
    assert turn["reasoning_chars"] == len(THINK)


def test_multi_turn_history_carries_earlier_answers(knowing: FakeOpenAIServer, keyed: None) -> None:
    report = run_suite(knowing, "core")
    assert report["failed"] == 0
    last = [body for path, body in knowing.requests if path == "/v1/chat/completions"][-1]
    roles = [m["role"] for m in last["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert last["messages"][1]["content"] == "OK"  # the answer, never the reasoning


def test_tool_calls_go_through_both_apis(knowing: FakeOpenAIServer, keyed: None) -> None:
    report = run_suite(knowing, "tools")
    assert report["failed"] == 0
    paths = [path for path, _ in knowing.requests if path.startswith("/v1/")]
    assert paths == ["/v1/chat/completions", "/v1/messages"]
    messages_body = next(body for path, body in knowing.requests if path == "/v1/messages")
    assert messages_body["tools"][0]["input_schema"]["required"] == ["city"]
    # "no cap" on /v1/messages: what the context leaves after the prompt
    assert 190_000 < messages_body["max_tokens"] < 200_000
    calls = report["cases"][0]["turns"][0]["tool_calls"]  # type: ignore[index]
    assert calls == [{"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}]


# --- sizing to the plan ---------------------------------------------------------------------


def test_needle_document_is_sized_to_max_model_len_with_the_needle_in_place(
    keyed: None,
) -> None:
    with knowing_server(api_key="sk-scripted-secret", max_model_len=6000) as server:
        report = run_suite(server, "long")
        assert report["failed"] == 0, report
        body = next(b for p, b in server.requests if p == "/v1/chat/completions")
    text = body["messages"][0]["content"]
    words = text.split()
    assert len(words) < 6000
    position = text.index("The access code for the copper vault is 7493.")
    assert 0.4 < position / len(text) < 0.6
    turn = report["cases"][0]["turns"][0]  # type: ignore[index]
    assert turn["document_tokens"] < 6000
    assert turn["prompt_tokens"] <= 6000


def test_multiturn_documents_shrink_to_fit_all_six_turns(keyed: None) -> None:
    with knowing_server(api_key="sk-scripted-secret", max_model_len=60_000) as server:
        report = run_suite(server, "multiturn")
    assert report["failed"] == 0, report["cases"]  # type: ignore[index]
    turns = report["cases"][0]["turns"]  # type: ignore[index]
    assert len(turns) == 6
    assert all(t["prompt_tokens"] < 60_000 for t in turns)
    # 6 answers x 2048 x 1.5 stay free; the documents got most of the rest
    assert turns[-1]["prompt_tokens"] > 35_000


def test_document_budget_scales_to_what_fits() -> None:
    case = select(builtin_gates(), "multiturn")[0]
    assert document_budget(case, None, GateOptions(), None) == 1.0
    assert document_budget(case, 1_000_000, GateOptions(), 500) == 1.0
    scale = document_budget(case, 100_000, GateOptions(), 500)
    # 6 turns x 2048 x 1.5 of answer room, the frame and 32 tokens of margin
    assert scale == pytest.approx((100_000 - 500 - 18_432 - 32) / 100_000)
    assert document_budget(case, 1024, GateOptions(max_tokens=400), 500) == 0.0


# --- failure paths --------------------------------------------------------------------------


def one_case(server: FakeOpenAIServer, suite: str, case: str, **options: object) -> dict:  # type: ignore[type-arg]
    target = target_for_url(server.url, None)
    cases = select(builtin_gates(), suite, (case,))
    report = run_cases(target, suite, cases, GateOptions(**options))  # type: ignore[arg-type]
    return report["cases"][0]  # type: ignore[no-any-return]


@pytest.fixture
def server(keyed: None) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(api_key="sk-scripted-secret", model="scripted") as scripted:
        yield scripted


def test_wrong_answer_fails_with_the_expectation(server: FakeOpenAIServer) -> None:
    server.when("17 multiplied", Reply(content="392"))
    result = one_case(server, "core", "math-multiply")
    assert not result["passed"]
    assert result["failures"] == ["turn 1: expected matches /\\b391\\b/; answer: '392'"]


def test_answer_only_in_reasoning_is_named(server: FakeOpenAIServer) -> None:
    server.when("17 multiplied", Reply(content="The answer.", reasoning="17*23 = 391"))
    result = one_case(server, "core", "math-multiply")
    assert "it is only in the reasoning, not the answer" in result["failures"][0]


def test_f12_reasoning_ate_the_budget(server: FakeOpenAIServer) -> None:
    server.when("17 multiplied", Reply(reasoning="long thoughts " * 5, finish_reason="length"))
    result = one_case(server, "core", "math-multiply", max_tokens=10)
    assert result["failure_ids"] == ["F12"]
    assert result["failures"][0] == (
        "turn 1: empty answer with finish_reason=length: reasoning used the whole budget (F12)"
    )
    body = next(b for p, b in server.requests if p == "/v1/chat/completions")
    assert body["max_tokens"] == 10


def test_f27_think_tags_in_the_answer(server: FakeOpenAIServer) -> None:
    server.when("17 multiplied", Reply(content="<think>multiply</think> 391"))
    result = one_case(server, "core", "math-multiply")
    assert result["failure_ids"] == ["F27"]
    assert "reasoning markup in the answer" in result["failures"][0]


def test_f27_everything_in_reasoning(server: FakeOpenAIServer) -> None:
    server.when("17 multiplied", Reply(reasoning="so it is 391"))
    result = one_case(server, "core", "math-multiply")
    assert "F27" in result["failure_ids"]
    assert "everything went to reasoning" in result["failures"][0]


def test_garbled_answer(server: FakeOpenAIServer) -> None:
    server.when("17 multiplied", Reply(content="391 \ufffd\ufffd\x01\x02\ufffd 数字数字"))
    result = one_case(server, "core", "math-multiply")
    assert any(f.startswith("turn 1: garbled answer:") for f in result["failures"])


def test_repetition_loop(server: FakeOpenAIServer) -> None:
    server.when("17 multiplied", Reply(content="391 " + "the same the same " * 40))
    result = one_case(server, "core", "math-multiply")
    assert any("repetition loop" in f for f in result["failures"])


def test_f05_tool_call_left_in_the_text(server: FakeOpenAIServer) -> None:
    markup = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    server.when("weather in Paris", Reply(content=markup))
    result = one_case(server, "tools", "chat-tool-call")
    assert result["failure_ids"] == ["F05"]
    assert result["failures"] == [
        "turn 1: the tool call came back as text in the answer, not parsed into tool_calls (F05)"
    ]


def test_f06_no_tool_use_on_messages(server: FakeOpenAIServer) -> None:
    server.when("weather in Paris", Reply(content="I would call a tool now."))
    result = one_case(server, "tools", "messages-tool-use")
    assert result["failures"] == ["turn 1: no tool_use block on /v1/messages (F06)"]


def test_wrong_tool_argument(server: FakeOpenAIServer) -> None:
    server.when(
        "weather in Paris", Reply(tool_calls=(ScriptedTool("get_weather", {"city": "Rome"}),))
    )
    result = one_case(server, "tools", "chat-tool-call")
    assert result["failures"] == [
        "turn 1: no matching get_weather call: argument city='Rome' does not match /paris/"
    ]


def test_http_error_is_a_failed_case_not_a_crash(server: FakeOpenAIServer) -> None:
    small = FakeOpenAIServer(
        api_key="sk-scripted-secret", model="scripted", max_model_len=20
    ).start()
    try:
        result = one_case(small, "core", "code-python")
    finally:
        small.stop()
    assert not result["passed"]
    assert result["failures"][0].startswith("turn 1: request failed: HTTP 400: maximum context")


def test_failed_turn_stops_the_case(server: FakeOpenAIServer) -> None:
    server.when("remember this", Reply(content="OK"))
    small = FakeOpenAIServer(api_key="sk-scripted-secret", model="scripted", max_model_len=60)
    small.when("remember this", Reply(content="OK"))
    small.start()
    try:
        result = one_case(small, "core", "multi-turn-memory")
    finally:
        small.stop()
    assert len(result["turns"]) == 2
    assert not result["passed"]


def test_cli_exits_1_and_names_known_failures(server: FakeOpenAIServer, cli: CliRunner) -> None:
    server.when("weather in Paris", Reply(content="<tool_call>get_weather</tool_call>"))
    code, out, _err = invoke(cli, "test", "tools", "--url", server.url)
    assert code == 1
    assert "FAIL tools/chat-tool-call" in out
    assert "tools: 0/2 cases passed - FAILED" in out
    assert "  F05 Tool calls silently dropped by the GLM-4.7 tool parser. Fix: " in out


def test_cli_json(server: FakeOpenAIServer, cli: CliRunner) -> None:
    server.when("17 multiplied", Reply(content="391"))
    code, out, _ = invoke(
        cli, "test", "core", "--case", "math-multiply", "--url", server.url, "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["ok"] is True
    assert data["suites"][0]["cases"][0]["id"] == "math-multiply"


# --- judge, directly --------------------------------------------------------------------------


def exchange(**fields: object) -> Exchange:
    ex = Exchange(api="chat", started=0.0)
    for name, value in fields.items():
        setattr(ex, name, value)
    return ex


def test_judge_warns_when_a_reasoning_plan_sends_no_reasoning() -> None:
    verdict = judge(exchange(content="391"), [Check(regex=r"\b391\b")], thinking=True)
    assert verdict.passed
    assert verdict.warnings == ["no reasoning came back separately, although the plan reasons"]


def test_judge_tool_arguments_must_be_json() -> None:
    call = ToolCall(name="get_weather", arguments="{city: Paris")
    wanted = Check.model_validate({"tool_call": {"name": "get_weather"}})
    verdict = judge(exchange(tool_calls=[call]), [wanted], thinking=None)
    assert verdict.failures == [
        "no matching get_weather call: arguments are not JSON: '{city: Paris'"
    ]


def test_judge_not_regex() -> None:
    verdict = judge(exchange(content="maybe"), [Check(not_regex="maybe")], thinking=None)
    assert verdict.failures == ["expected does not match /maybe/; answer: 'maybe'"]


# --- input errors -----------------------------------------------------------------------------


def test_unknown_suite(cli: CliRunner, server: FakeOpenAIServer) -> None:
    code, _, err = invoke(cli, "test", "cor", "--url", server.url)
    assert code == 2
    assert err.strip() == (
        "Error: no gate suite 'cor'; did you mean 'core'? "
        "(hint: suites: core, long, multiturn, tools)"
    )


def test_unknown_case(cli: CliRunner, server: FakeOpenAIServer) -> None:
    code, _, err = invoke(cli, "test", "core", "--case", "math-multiplyy", "--url", server.url)
    assert code == 2
    assert err.startswith(
        "Error: suite 'core' has no case 'math-multiplyy'; did you mean 'math-multiply'?"
    )


def test_case_with_two_suites(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "test", "core,long", "--case", "x")
    assert code == 2
    assert err.strip() == (
        "Error: --case works with one suite (hint: e.g. sm120 test core --case ID)"
    )


def test_bad_max_tokens_and_temperature(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "test", "core", "--max-tokens", "0")
    assert (code, err.strip()) == (
        2,
        "Error: --max-tokens must be 1 or more, got 0 (hint: or leave it out)",
    )
    code, _, err = invoke(cli, "test", "core", "--temperature", "3")
    assert err.strip() == "Error: --temperature must be 2 or less, got 3 (hint: e.g. 0)"


def test_no_deployment(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "test", "core")
    assert code == 2
    assert err.strip() == "Error: no deployment is running (hint: start one: sm120 launch tiny)"


def test_url_and_name_together(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "test", "core", "--url", "http://127.0.0.1:9", "--name", "x")
    assert code == 2
    assert (
        err.strip() == "Error: --url and --name both given (hint: pick one: a deployment or a URL)"
    )


def test_unreachable_server(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "test", "core", "--url", "http://127.0.0.1:9")
    assert code == 2
    assert err.strip() == (
        "Error: server not reachable at http://127.0.0.1:9 "
        "(hint: check that the deployment is running: sm120 status)"
    )


def test_wrong_api_key(
    cli: CliRunner, server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    code, _, err = invoke(cli, "test", "core", "--url", server.url)
    assert code == 2
    assert err.startswith(f"Error: the server at {server.url} rejected the API key (HTTP 401")
    assert "sk-wrong" not in err


def test_cases_file_errors(tmp_path: Path, cli: CliRunner, server: FakeOpenAIServer) -> None:
    bad = tmp_path / "gates.yaml"
    bad.write_text(
        "suites:\n  mine:\n    description: d\n    cases:\n"
        "      - id: a\n        title: t\n        turns:\n"
        "          - user: hi\n            expect:\n              - regex: '(unclosed'\n"
    )
    code, _, err = invoke(cli, "test", "mine", "--cases", str(bad), "--url", server.url)
    assert code == 2
    assert re.fullmatch(
        r"Error: .*gates\.yaml: suites\.mine\.cases\.0\.turns\.0\.expect\.0: Value error, not a "
        r"valid regex \(missing \), unterminated subpattern at position 0\) "
        r"\(hint: see sm120/data/gates\.yaml for the format\)\n",
        err,
    )
    code, _, err = invoke(cli, "test", "mine", "--cases", str(tmp_path / "nope.yaml"))
    assert err.strip() == (
        f"Error: cannot read --cases {tmp_path / 'nope.yaml'}: No such file or directory "
        "(hint: check --cases)"
    )


def test_a_check_has_exactly_one_kind() -> None:
    with pytest.raises(ValueError, match="exactly one of regex, not_regex, tool_call"):
        Check(regex="a", not_regex="b")
    with pytest.raises(Exception, match="duplicate case ids: a"):
        parse_gate_file(
            "suites:\n  s:\n    description: d\n    cases:\n"
            "      - {id: a, title: t, turns: [{user: x}]}\n"
            "      - {id: a, title: t, turns: [{user: y}]}\n",
            "x.yaml",
        )
