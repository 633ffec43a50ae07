"""Workloads: the built-in shapes share prefixes as real sessions do, prompts fit the context,
and the replay format is read strictly (one line of error, naming the line)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from sm120.tune.objective import PromptMaker
from sm120.tune.pairs import Pair, verdict
from sm120.tune.space import TuneError
from sm120.tune.workload import build_workload, read_replay


def test_the_agent_shape_grows_one_history_per_session() -> None:
    workload = build_workload("agent", 2, 16384)
    first, second = workload.sessions
    assert len(first) == 10
    # Each turn starts with the whole previous prompt: a prefix-cache hit in real use.
    for earlier, later in itertools.pairwise(first):
        assert later.parts[: len(earlier.parts)] == earlier.parts
    # Sessions share the system prompt and notes, not their own turns.
    assert first[0].parts[:2] == second[0].parts[:2]
    assert first[0].parts[2] != second[0].parts[2]
    assert first[0].parts[1].tokens == 4000  # a quarter of the context, at most 4,000


def test_prompts_are_cut_to_fit_and_the_cut_is_said() -> None:
    workload = build_workload("chat", 6, 1024)
    assert max(t.prompt_tokens + t.output_tokens for s in workload.sessions for t in s) <= 1016
    assert workload.notes == ("2 prompts cut to fit max-model-len 1024",)


def test_an_unknown_workload_is_refused() -> None:
    with pytest.raises(TuneError) as caught:
        build_workload("chatty", 4, None)
    assert caught.value.one_line() == (
        "unknown --workload 'chatty' (hint: choose from: chat, agent, long, replay:FILE)"
    )


def test_a_replay_keeps_sessions_and_their_order(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_text(
        '{"session": "a", "parts": [{"hash": "sys", "tokens": 100}, {"hash": "u1", "tokens": 5}],'
        ' "output_tokens": 20, "key": "alice"}\n'
        "\n"
        '{"session": "b", "parts": [{"hash": "sys", "tokens": 100}], "output_tokens": 7}\n'
        '{"session": "a", "parts": [{"hash": "sys", "tokens": 100}, {"hash": "u1", "tokens": 5},'
        ' {"hash": "u2", "tokens": 9}], "output_tokens": 30}\n'
    )
    workload = build_workload(f"replay:{log}", 99, 4096)
    a, b = workload.sessions
    assert [t.prompt_tokens for t in a] == [105, 114]
    assert [t.output_tokens for t in a] == [20, 30]
    assert b[0].parts[0] == a[0].parts[0]
    assert workload.name == "replay:requests.jsonl"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1, 2]", "not a JSON object (hint: one request per line)"),
        ('{"parts": [], "output_tokens": 3}', "'parts' must be a list of {hash, tokens}"),
        ('{"parts": [{"hash": "x", "tokens": 0}], "output_tokens": 3}',
         "each part needs 'hash' and a positive 'tokens'"),
        ('{"parts": [{"hash": "x", "tokens": 4}], "output_tokens": true}',
         "'output_tokens' must be a positive integer"),
    ],
)  # fmt: skip
def test_a_bad_replay_line_is_named(tmp_path: Path, line: str, message: str) -> None:
    log = tmp_path / "bad.jsonl"
    log.write_text('{"parts": [{"hash": "x", "tokens": 4}], "output_tokens": 3}\n' + line + "\n")
    with pytest.raises(TuneError) as caught:
        read_replay(log)
    assert caught.value.one_line().startswith(f"{log}:2: {message}")


def test_equal_hashes_are_equal_tokens_and_rounds_differ() -> None:
    class Wire:
        def tokenize(self, model: str, prompt: str) -> list[int]:
            return list(range(100, 140))

    maker = PromptMaker(Wire(), "tiny")  # type: ignore[arg-type]
    assert maker.ids("sys", 50, "round-0") == maker.ids("sys", 50, "round-0")
    assert maker.ids("sys", 50, "round-0") != maker.ids("sys", 50, "round-1")
    assert maker.ids("sys", 50, "round-0") != maker.ids("user", 50, "round-0")
    assert set(maker.ids("sys", 500, "r")) <= set(range(100, 140))


def test_a_gain_needs_every_pair_to_agree() -> None:
    agree = [Pair(100, 110, True), Pair(100, 104, False), Pair(100, 108, True)]
    found = verdict(agree, higher_is_better=True)
    assert (found["gain"], found["change_pct"], found["lowest_pct"]) == (True, 8.0, 4.0)
    assert found["noise_pct"] == 4.0
    split = [Pair(100, 110, True), Pair(100, 97, False), Pair(100, 108, True)]
    assert verdict(split, True)["gain"] is False
    assert verdict(split, True)["why"] == "inside the noise: the pairs disagree"
    assert verdict([Pair(100, 150, True)], True)["gain"] is False  # one pair: no noise known
    # Lower is better (TTFT): 80 ms against 100 is +20%.
    assert verdict([Pair(100, 80, True), Pair(100, 82, False)], False)["change_pct"] == 19.0


def test_the_gateways_request_log_replays_with_its_prefix_structure(tmp_path: Path) -> None:
    """docs/gateway.md's request log (team's `gateway start --request-log`): lengths in
    characters and hashes; one ratio from the log's own prompt_tokens makes them tokens."""

    def line(messages: list[list[object]], prompt: int, status: int = 200) -> str:
        return json.dumps({
            "v": 1, "at": 1.0, "key": "ann", "model": "tiny", "protocol": "messages",
            "status": status, "prompt_tokens": prompt, "cached_tokens": 0,
            "completion_tokens": 42, "ttft_ms": 18.0,
            "system": {"len": 4000, "hash": "3f2a", "lines": [[61, "9ab0", "billing"]]},
            "tools": [[800, "a1b2"]],
            "messages": messages,
        })  # fmt: skip

    first = [["user", 200, "5e6f"]]
    second = [*first, ["assistant", 400, "1a2b"], ["user", 200, "77aa"]]
    log = tmp_path / "requests.jsonl"
    log.write_text(
        "\n".join([line(first, 1250), line(second, 1400), line(second, 9, status=429)]) + "\n"
    )
    (session,) = build_workload(f"replay:{log}", 1, 8192).sessions
    assert len(session) == 2  # the 429 is left out
    one, two = session
    # 2,650 tokens over 10,600 characters: a quarter of a token each.
    assert [p.tokens for p in one.parts] == [1000, 200, 50]
    assert two.parts[:3] == one.parts  # the second turn extends the first
    assert [p.tokens for p in two.parts[3:]] == [100, 50]
    assert one.output_tokens == 42
