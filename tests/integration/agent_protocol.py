"""Coding agents against the real tiny vLLM through the gateway, on the engines of
tests/integration/test_gateway_realstack.py (its module-scoped `stack`; that module imports
these tests, so no engine is started for them):

- a Responses conformance set of the request shapes Codex 0.171 sends (read off a real
  `codex exec` request: function and namespace tools, custom free-form tools, `store: false`,
  `include: ["reasoning.encrypted_content"]`, `parallel_tool_calls`, developer messages, a
  tool round trip as function_call + function_call_output items) and the streamed events it
  reads;
- the stored-responses switch: the bare 404 on the engine alone, the answer with why through
  the gateway (sm120/gateway/absorb.py);
- Claude Code and Codex themselves, from npm (.ci/run installs them into
  ~/.cache/sm120/agent-clients), set up by `sm120 connect --write` in a HOME of their own and
  driven non-interactively: a turn each, a wrong key and a gateway that is down, with times.
  They need no network beyond loopback and no login: Claude Code takes its key from the
  apiKeyHelper connect writes, Codex from its provider's auth command.

The model is random: its words are noise, so these check the protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.realstack import cli_env

CLIENTS_DIR = Path(
    os.environ.get("SM120_AGENT_CLIENTS", Path.home() / ".cache" / "sm120" / "agent-clients")
)
# What .ci/run installs (and the versions every setting connect writes was read in).
CLAUDE = CLIENTS_DIR / "node_modules" / ".bin" / "claude"
CODEX = CLIENTS_DIR / "node_modules" / ".bin" / "codex"
# Codex sends no max_output_tokens: it talks to tiny-b, whose generation config caps a reply
# at 64 tokens (random weights rarely stop); Claude Code is given the same cap itself.
REPLY_CAP = 64
WORDS = {"type": "string", "enum": ["ls", "pwd"]}
EXEC_TOOL = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command.",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"cmd": WORDS},
        "required": ["cmd"],
        "additionalProperties": False,
    },
}
# The shapes of Codex 0.171's first request, with texts of our own.
CODEX_SHAPE: dict[str, Any] = {
    "instructions": "You are a coding agent.",
    "input": [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "Sandbox: read-only."}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "List the files."}]},
    ],
    "tools": [
        EXEC_TOOL,
        {"type": "namespace", "name": "agents", "description": "Sub-agents.",
         "tools": [{"type": "function", "name": "close_agent", "description": "Close one.",
                    "strict": False,
                    "parameters": {"type": "object", "properties": {"id": {"type": "string"}},
                                   "required": ["id"], "additionalProperties": False}}]},
        {"type": "custom", "name": "apply_patch", "description": "Apply a patch (free text)."},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "conformance",
    "max_output_tokens": 16,
}  # fmt: skip
# The events Codex's exec loop reads off a Responses stream.
CODEX_EVENTS = ("response.created", "response.output_item.added", "response.output_item.done")


def _post(stack: dict[str, Any], body: dict[str, Any], stream: bool) -> tuple[int, list[Any]]:
    """Status and the parsed events (stream) or the one answer."""
    url = f"{stack['gateway']}/v1/responses"
    headers = {"Authorization": f"Bearer {stack['key']}"}
    sent = {**body, "model": "tiny-a", "stream": stream}
    if not stream:
        answer = httpx.post(url, json=sent, headers=headers, timeout=120)
        return answer.status_code, [answer.json()]
    events = []
    with httpx.stream("POST", url, json=sent, headers=headers, timeout=120) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
        return answer.status_code, events or [answer.read()]


def _streamed_in_codex_order(events: list[Any]) -> dict[str, Any]:
    kinds = [event["type"] for event in events]
    assert kinds[0] == "response.created", kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    for kind in CODEX_EVENTS:
        assert kind in kinds, kinds
    final: dict[str, Any] = events[-1]["response"]
    assert final["usage"]["input_tokens"] > 0
    return final


def test_codex_first_request_shape_streams_the_events_codex_reads(stack: dict[str, Any]) -> None:
    status, events = _post(stack, CODEX_SHAPE, stream=True)
    assert status == 200, events
    final = _streamed_in_codex_order(events)
    assert final["status"] in ("completed", "incomplete")


def test_codex_forced_tool_call_is_well_formed_and_its_output_goes_back(
    stack: dict[str, Any],
) -> None:
    forced = {**CODEX_SHAPE, "tool_choice": {"type": "function", "name": "exec_command"},
              "max_output_tokens": 256}  # fmt: skip
    status, events = _post(stack, forced, stream=True)
    assert status == 200, events
    final = _streamed_in_codex_order(events)
    calls = [item for item in final["output"] if item["type"] == "function_call"]
    assert [call["name"] for call in calls] == ["exec_command"], final["output"]
    assert json.loads(calls[0]["arguments"])["cmd"] in ("ls", "pwd")
    kinds = [event["type"] for event in events]
    assert "response.function_call_arguments.delta" in kinds
    # The round trip as Codex sends it: the call and its output back in `input`.
    follow_up = {
        **CODEX_SHAPE,
        "input": [*CODEX_SHAPE["input"],
                  {"type": "function_call", "call_id": calls[0]["call_id"],
                   "name": "exec_command", "arguments": calls[0]["arguments"]},
                  {"type": "function_call_output", "call_id": calls[0]["call_id"],
                   "output": "a.py\nb.py"}],
    }  # fmt: skip
    status, events = _post(stack, follow_up, stream=True)
    assert status == 200, events
    _streamed_in_codex_order(events)


def test_codex_shapes_answer_without_streaming_too(stack: dict[str, Any]) -> None:
    status, (answer,) = _post(stack, CODEX_SHAPE, stream=False)
    assert status == 200, answer
    assert answer["object"] == "response" and answer["status"] in ("completed", "incomplete")


def test_a_previous_response_the_engine_never_kept_is_answered_with_why(
    stack: dict[str, Any],
) -> None:
    """On the engine alone a bare 404; through the gateway the same status, saying why and
    what works, before the engine is asked."""
    body = {"model": "tiny-a", "input": "go on", "previous_response_id": "resp_sm120test",
            "max_output_tokens": 4}  # fmt: skip
    key = (Path(stack["home"]) / "deployments" / "tiny-a" / "api_key").read_text().strip()
    direct = httpx.post(
        f"http://127.0.0.1:{stack['ports']['tiny-a']}/v1/responses", json=body,
        headers={"Authorization": f"Bearer {key}"}, timeout=60,
    )  # fmt: skip
    assert direct.status_code == 404
    assert direct.json()["error"]["message"] == "Response with id 'resp_sm120test' not found."
    relayed = httpx.post(
        f"{stack['gateway']}/v1/responses", json=body,
        headers={"Authorization": f"Bearer {stack['key']}"}, timeout=60,
    )  # fmt: skip
    assert relayed.status_code == 404
    message = relayed.json()["error"]["message"]
    assert message.startswith("deployment tiny-a's engine keeps no responses, so response")
    assert "send the whole conversation with store: false" in message
    fetched = httpx.get(
        f"{stack['gateway']}/v1/responses/resp_sm120test",
        headers={"Authorization": f"Bearer {stack['key']}"}, timeout=60,
    )  # fmt: skip
    assert fetched.status_code == 404
    assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in fetched.json()["error"]["message"]


# --- the real clients ---------------------------------------------------------------------


def _need(client: Path) -> None:
    if not client.exists():
        pytest.skip(f"{client.name} is not installed in {CLIENTS_DIR} (.ci/run installs it)")


def _user(stack: dict[str, Any], tmp_path: Path) -> dict[str, str]:
    """The environment a user's shell has: their own HOME, sm120's state, nothing exported
    for the clients (no key, no base URL)."""
    env = cli_env(Path(stack["home"]))
    env["HOME"] = str(tmp_path / "user")
    (tmp_path / "user").mkdir(exist_ok=True)
    for name in list(env):
        if name.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_")):
            del env[name]
    return env


def _connect(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sm120", "connect", *args], env=env, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[Any, float]:
    began = time.monotonic()
    done = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    return done, time.monotonic() - began


def _claude_settings(env: dict[str, str], **changes: str) -> None:
    path = Path(env["HOME"]) / ".claude" / "settings.json"
    settings = json.loads(path.read_text())
    settings["env"].update(changes)
    path.write_text(json.dumps(settings))


def test_claude_code_completes_a_turn_through_connect_write(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    _need(CLAUDE)
    env = _user(stack, tmp_path)
    _connect(env, "claude-code", "tiny-a", "--write")
    # CI's bound on a random model's reply; everything else as connect wrote it.
    _claude_settings(env, CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(REPLY_CAP))
    done, took = _run([str(CLAUDE), "-p", "say hi", "--output-format", "json"], env, tmp_path, 300)
    print(f"\nclaude -p turn: {took:.1f} s")
    result = json.loads(done.stdout)
    # Every request was answered (no HTTP error on the way); a random model never ends its
    # reply, so Claude Code ends the turn at the cap with 'max_output_tokens' (and exit 1)
    # where a real model would end it itself.
    assert result["type"] == "result" and result["num_turns"] >= 1, result
    assert result.get("api_error_status") is None, result
    assert result.get("api_error") in (None, "max_output_tokens"), result
    assert done.returncode == (0 if result.get("api_error") is None else 1)
    usage = result["usage"]
    prompt = (usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)) // max(
        1, result["num_turns"]
    )
    print(f"claude code's prompt on the tiny tokenizer: {prompt} tokens a request")
    assert prompt > 5000  # its own prompt and tools reached the engine


def test_codex_completes_a_turn_through_connect_write(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    _need(CODEX)
    env = _user(stack, tmp_path)
    out = _connect(env, "codex", "tiny-b", "--write")
    assert out.splitlines()[-1] == "then: codex -p sm120"
    argv = [str(CODEX), "exec", "-p", "sm120", "--skip-git-repo-check", "--json", "say hi"]
    done, took = _run(argv, env, tmp_path, 300)
    print(f"\ncodex exec turn: {took:.1f} s")
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    kinds = [event.get("type") for event in events]
    assert done.returncode == 0 and "turn.completed" in kinds, done.stdout[-3000:] + done.stderr
    usage = next(event["usage"] for event in events if event.get("type") == "turn.completed")
    print(f"codex's first prompt on the tiny tokenizer: {usage['input_tokens']} tokens")
    assert usage["input_tokens"] > 3000


def test_a_wrong_key_ends_both_clients_within_seconds(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    """The gateway's 401 carries x-should-retry: false and connect bounds the retries: each
    client gives up at once instead of minutes of silent retries."""
    _need(CLAUDE)
    _need(CODEX)
    env = _user(stack, tmp_path)
    _connect(env, "claude-code", "tiny-a", "--write")
    _connect(env, "codex", "tiny-b", "--write")
    wrong = tmp_path / "wrong-key"
    wrong.write_text("not-the-key")
    settings = Path(env["HOME"]) / ".claude" / "settings.json"
    data = json.loads(settings.read_text())
    data["apiKeyHelper"] = f"cat {wrong}"
    settings.write_text(json.dumps(data))
    profile = Path(env["HOME"]) / ".codex" / "sm120.config.toml"
    key_file = str(Path(stack["home"]) / "gateway" / "api_key")
    profile.write_text(profile.read_text().replace(key_file, str(wrong)))
    claude, claude_s = _run([str(CLAUDE), "-p", "say hi"], env, tmp_path, 300)
    codex, codex_s = _run(
        [str(CODEX), "exec", "-p", "sm120", "--skip-git-repo-check", "say hi"], env, tmp_path, 300
    )
    print(f"\nwrong key: claude -p {claude_s:.1f} s, codex exec {codex_s:.1f} s")
    assert claude.returncode != 0 and codex.returncode != 0
    assert claude_s < 60 and codex_s < 60


def test_a_gateway_that_is_down_ends_claude_code_in_seconds_and_codex_waits(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    """Claude Code gives up after connect's CLAUDE_CODE_MAX_RETRIES (its own 10 retries took
    186 s); Codex 0.171 keeps printing 'Reconnecting... waiting for network' whatever its
    provider's retry bounds say, so its symptom is what docs/gateway.md maps to `sm120
    gateway status`."""
    _need(CLAUDE)
    _need(CODEX)
    env = _user(stack, tmp_path)
    _connect(env, "claude-code", "tiny-a", "--write")
    _connect(env, "codex", "tiny-b", "--write")
    # Nothing listens there: as after `sm120 gateway stop`.
    from tests.helpers import free_port

    down = f"http://127.0.0.1:{free_port()}"
    _claude_settings(env, ANTHROPIC_BASE_URL=down)
    profile = Path(env["HOME"]) / ".codex" / "sm120.config.toml"
    profile.write_text(profile.read_text().replace(stack["gateway"], down))
    claude, claude_s = _run([str(CLAUDE), "-p", "say hi"], env, tmp_path, 300)
    argv = [str(CODEX), "exec", "-p", "sm120", "--skip-git-repo-check", "say hi"]
    began = time.monotonic()
    try:
        codex = subprocess.run(
            argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=CODEX_WAIT_S
        )
        codex_said = codex.stdout + codex.stderr
        ended = f"ended ({codex.returncode})"
    except subprocess.TimeoutExpired as waited:
        codex_said = (waited.stdout or b"").decode() + (waited.stderr or b"").decode()
        ended = "still waiting"
    codex_s = time.monotonic() - began
    print(f"\ngateway down: claude -p {claude_s:.1f} s, codex exec {ended} at {codex_s:.0f} s")
    assert claude.returncode != 0 and claude_s < 60, claude.stdout + claude.stderr
    assert "Reconnecting" in codex_said or "error" in codex_said.lower(), codex_said[-2000:]


# How long the gateway-down test lets Codex wait before calling it a wait.
CODEX_WAIT_S = 30
