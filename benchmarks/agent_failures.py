"""How long Claude Code and Codex take to fail, with the retry bounds `sm120 connect --write`
writes against each client's own defaults, side by side from one run: a wrong key (the
gateway's 401, which carries x-should-retry: false) and a gateway that is down (nothing
listens). No engine is needed: the gateway refuses a wrong key itself.

    CLIENTS=~/.cache/sm120/agent-clients python benchmarks/agent_failures.py [--cap 90]

Each case runs once (a client's retry schedule is its own, not noise); a case still waiting at
--cap seconds is stopped and reported as such. Writes benchmarks/results/agent-failures.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bare_engine import free_port  # noqa: E402

RESULT = REPO / "benchmarks" / "results" / "agent-failures.json"


def _sm120(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sm120", *args], env=env, capture_output=True, text=True,
        check=False, timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"sm120 {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _timed(argv: list[str], env: dict[str, str], cwd: Path, cap: float) -> dict[str, Any]:
    began = time.monotonic()
    try:
        done = subprocess.run(
            argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=cap, check=False
        )
        said = (done.stdout + done.stderr).strip().splitlines()
        return {"seconds": round(time.monotonic() - began, 1), "exit": done.returncode,
                "last_line": said[-1][:160] if said else ""}  # fmt: skip
    except subprocess.TimeoutExpired as waited:
        out = waited.stdout or b""
        err = waited.stderr or b""
        raw = out + err if isinstance(out, bytes) and isinstance(err, bytes) else b""
        lines = raw.decode(errors="replace").strip().splitlines()
        return {"seconds": cap, "exit": None, "still_waiting": True,
                "last_line": lines[-1][:160] if lines else ""}  # fmt: skip


def _claude_env(home: Path, changes: dict[str, Any], drop: tuple[str, ...]) -> None:
    path = home / ".claude" / "settings.json"
    settings = json.loads(path.read_text())
    for name in drop:
        settings["env"].pop(name, None)
    for name, value in changes.items():
        if name == "apiKeyHelper":
            settings["apiKeyHelper"] = value
        else:
            settings["env"][name] = value
    path.write_text(json.dumps(settings))


def _codex_profile(home: Path, bounded: bool, replace: tuple[str, str] | None) -> None:
    path = home / ".codex" / "sm120.config.toml"
    text = path.read_text()
    if not bounded:
        text = re.sub(r"^(request_max_retries|stream_max_retries) = .*\n", "", text, flags=re.M)
    if replace is not None:
        text = text.replace(*replace)
    path.write_text(text)


def _mark(row: dict[str, Any]) -> str:
    return f"{row['seconds']:.1f}{'+' if row.get('still_waiting') else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=90.0)
    args = parser.parse_args()
    clients = Path(os.environ.get("CLIENTS", Path.home() / ".cache/sm120/agent-clients"))
    claude = clients / "node_modules/.bin/claude"
    codex = clients / "node_modules/.bin/codex"
    versions = {
        "claude": subprocess.run([claude, "--version"], capture_output=True, text=True).stdout,
        "codex": subprocess.run([codex, "--version"], capture_output=True, text=True).stdout,
    }
    work = Path(tempfile.mkdtemp(prefix="agent-failures-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM120_", "ANTHROPIC_"))}
    env.update(SM120_HOME=str(work / "state"), NO_COLOR="1")
    port = free_port()
    _sm120(env, "gateway", "start", "--port", str(port))
    root = f"http://127.0.0.1:{port}"
    key_file = str(work / "state" / "gateway" / "api_key")
    wrong = work / "wrong-key"
    wrong.write_text("not-the-key")
    down = f"http://127.0.0.1:{free_port()}"
    rows: list[dict[str, Any]] = []
    try:
        for case in ("wrong key", "gateway down"):
            for bounded in (True, False):
                home = work / f"home-{len(rows)}"
                home.mkdir()
                user = {**env, "HOME": str(home)}
                _sm120(user, "connect", "claude-code", "--model", "tiny", "--write")
                _sm120(user, "connect", "codex", "--model", "tiny", "--write")
                changes: dict[str, Any] = (
                    {"apiKeyHelper": f"cat {wrong}"} if case == "wrong key"
                    else {"ANTHROPIC_BASE_URL": down}
                )  # fmt: skip
                drop = () if bounded else ("CLAUDE_CODE_MAX_RETRIES",)
                _claude_env(home, changes, drop)
                swap = (key_file, str(wrong)) if case == "wrong key" else (root, down)
                _codex_profile(home, bounded, swap)
                settings = "connect's bounds" if bounded else "the client's defaults"
                for client, argv in (
                    ("claude -p", [str(claude), "-p", "say hi"]),
                    ("codex exec", [str(codex), "exec", "-p", "sm120",
                                    "--skip-git-repo-check", "say hi"]),
                ):  # fmt: skip
                    row = {"case": case, "client": client, "settings": settings}
                    row.update(_timed(argv, user, home, args.cap))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        _sm120(env, "gateway", "stop")
    print(f"\n{'case':<13} {'client':<11} {'bounded s':>10} {'default s':>10} {'ratio':>7}")
    for case in ("wrong key", "gateway down"):
        for client in ("claude -p", "codex exec"):
            pair = {r["settings"]: r for r in rows if r["case"] == case and r["client"] == client}
            ours, theirs = pair["connect's bounds"], pair["the client's defaults"]
            ratio = theirs["seconds"] / ours["seconds"] if ours["seconds"] else float("nan")
            print(f"{case:<13} {client:<11} {_mark(ours):>10} {_mark(theirs):>10} {ratio:>7.1f}")
    RESULT.write_text(json.dumps({
        "command": "CLIENTS=~/.cache/sm120/agent-clients python benchmarks/agent_failures.py "
                   f"--cap {args.cap:g}",
        "versions": {k: v.strip() for k, v in versions.items()},
        "cap_s": args.cap, "rows": rows,
        "note": "'+' / still_waiting: stopped at the cap, the client had not given up",
    }, indent=1) + "\n")  # fmt: skip
    print(f"\nwrote {RESULT}")


if __name__ == "__main__":
    main()
