#!/usr/bin/env bash
# A real Claude Code session through `sm120 gateway` on this CPU machine: the tiny model,
# its position limit stretched from 4,096 to 131,072 (random weights do not care; Claude
# Code's own system prompt and tools are ~11k tokens on the tiny byte-level tokenizer), served
# with auto tool choice, the gateway with a `claude-*` alias, `sm120 connect claude-code
# --write` into a throwaway HOME, then `claude -p`. Prints Claude Code's answer (noise: the
# weights are random) and the engine's prefix-cache figures; stops everything it started.
#
#   CLAUDE=/path/to/claude VLLM_PYTHON=... bash benchmarks/claude_code_session.sh
# (npm install --prefix DIR @anthropic-ai/claude-code gives DIR/node_modules/.bin/claude)
set -euo pipefail
: "${CLAUDE:?set CLAUDE to the claude executable}"
work=$(mktemp -d)
export SM120_HOME="$work/sm120" HOME_FOR_CLAUDE="$work/user"
port=${PORT:-8123}
gateway_port=${GATEWAY_PORT:-18900}
cleanup() { sm120 gateway stop >/dev/null 2>&1 || true; sm120 stop tiny >/dev/null 2>&1 || true; }
trap cleanup EXIT

"${VLLM_PYTHON:?set VLLM_PYTHON to the engine python}" - "$work/tiny" <<'PY'
import json, sys
from pathlib import Path
from sm120.engine.tiny_model import ensure_tiny_model
import os
dest = Path(sys.argv[1])
ensure_tiny_model(Path(os.environ["VLLM_PYTHON"]), dest, lambda _: None)
config = json.loads((dest / "config.json").read_text())
config["max_position_embeddings"] = 131072
(dest / "config.json").write_text(json.dumps(config, indent=2))
PY
sm120 launch tiny --yes --port "$port" --model-dir "$work/tiny" --set max-model-len=65536 \
  --set enable-auto-tool-choice=true --set tool-call-parser=hermes | tail -1
sm120 gateway start --port "$gateway_port" --alias 'claude-*=tiny'
mkdir -p "$HOME_FOR_CLAUDE" "$work/project" && echo hello > "$work/project/notes.txt"
HOME="$HOME_FOR_CLAUDE" sm120 connect claude-code --write
cd "$work/project"
SECONDS=0
HOME="$HOME_FOR_CLAUDE" CLAUDE_CODE_MAX_OUTPUT_TOKENS=128 "$CLAUDE" -p "list the files here" || true
echo "claude -p took ${SECONDS} s"
grep -c '"POST /v1/messages' "$SM120_HOME/deployments/tiny/logs/serve.log" | sed 's/^/requests to \/v1\/messages: /'
sm120 status | grep -E "prefix|running"
