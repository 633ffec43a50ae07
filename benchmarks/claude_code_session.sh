#!/usr/bin/env bash
# The agent quickstart on this CPU machine, timed: `sm120 launch tiny -V agent` (the tiny model
# with its positions stretched by hf-overrides to 64k, since Claude Code's own prompt and tool
# definitions are ~32k tokens on the tiny byte-level tokenizer, and the hermes tool parser),
# the gateway with a `claude-*` alias, `sm120 connect claude-code --write` (and codex) into a
# throwaway HOME, then one `claude -p` turn and one `codex exec` turn. Prints each step's
# seconds and the engine's request lines; stops everything it started. The answers are noise
# (random weights): the point is that both clients complete a turn with their real prompts.
#
#   CLAUDE=/path/to/claude [CODEX=/path/to/codex] VLLM_PYTHON=... bash benchmarks/claude_code_session.sh
# (npm install --prefix DIR @anthropic-ai/claude-code @openai/codex puts both in DIR/node_modules/.bin)
# Run it under the shared lock on a shared machine: flock /tmp/sm120-heavy.lock bash ...
set -euo pipefail
: "${CLAUDE:?set CLAUDE to the claude executable}"
: "${VLLM_PYTHON:?set VLLM_PYTHON to the engine python}"
work=$(mktemp -d)
export SM120_HOME="$work/sm120" VLLM_PYTHON
user_home="$work/user"
port=${PORT:-8123}
gateway_port=${GATEWAY_PORT:-18900}
cleanup() { sm120 gateway stop >/dev/null 2>&1 || true; sm120 stop tiny >/dev/null 2>&1 || true; }
trap cleanup EXIT

SECONDS=0
sm120 launch tiny -V agent --yes --port "$port" | tail -1
echo "launch tiny -V agent (model build, engine start, READY): ${SECONDS} s"
sm120 gateway start --port "$gateway_port" --alias 'claude-*=tiny' >/dev/null
mkdir -p "$user_home" "$work/project" && echo hello > "$work/project/notes.txt"
HOME="$user_home" sm120 connect claude-code --write >/dev/null
cd "$work/project"

# A short output cap: random weights rarely stop on their own.
SECONDS=0
HOME="$user_home" CLAUDE_CODE_MAX_OUTPUT_TOKENS=128 "$CLAUDE" -p "list the files here" \
  >"$work/claude.out" 2>&1 || echo "claude -p exited $?"
echo "claude -p turn: ${SECONDS} s"
tail -c 300 "$work/claude.out"; echo

if [ -n "${CODEX:-}" ]; then
  HOME="$user_home" sm120 connect codex --write >/dev/null
  SECONDS=0
  # connect writes Codex a profile of its own (~/.codex/sm120.config.toml) whose provider
  # reads the key with its auth command: nothing to export.
  HOME="$user_home" timeout 600 "$CODEX" exec -p sm120 --skip-git-repo-check "list the files here" \
    >"$work/codex.out" 2>&1 || echo "codex exec exited $?"
  echo "codex exec turn: ${SECONDS} s"
  tail -c 300 "$work/codex.out"; echo
fi

log="$SM120_HOME/deployments/tiny/logs/serve.log"
grep -oE '"(POST|GET) /v1/[a-z/_]+[^"]*" [0-9]{3}' "$log" | sort | uniq -c
sm120 status | grep -E "prefix|running" || true
