"""A node reached over SSH that runs the engine's own Python (no container).

Every call is one `ssh HOST -- PYTHON -c <agent source> COMMAND` with the request as JSON on
stdin (see sm120/engine/cluster/agent.py): nothing is installed on the node, and the engine's
environment (the API key included) never appears on a command line. The remote command goes
through the login shell of the node, so it is quoted with shlex for a POSIX shell.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from sm120.engine.cluster.hosts import parse_ssh_options
from sm120.engine.cluster.node import NodeError, ProbeRequest, ProcessState, StartRequest

KIND = "ssh"
# Where processes keep their pid, log and exit record on the node; stop removes it.
RUN_ROOT = "/tmp/sm120-run"
BASE_OPTIONS = ("BatchMode=yes", "ConnectTimeout=15", "LogLevel=ERROR")
CALL_TIMEOUT = 120.0
SSH_HINT = "check that 'ssh HOST true' works without a password prompt (keys, known_hosts)"
PYTHON_HINT = "--vllm-python must name the engine's Python, at the same path on every node"


@cache
def agent_source() -> str:
    return Path(__file__).with_name("agent.py").read_text(encoding="utf-8")


class SshNode:
    def __init__(
        self,
        host: str,
        *,
        rank: int,
        python: str,
        options: Sequence[str] = (),
        run_root: str = RUN_ROOT,
        ssh: str = "ssh",
    ) -> None:
        self.host = host
        self.rank = rank
        self.python = python
        # Checked here, the one door to ssh: a record read back is held to what --ssh-option is.
        self.options = parse_ssh_options(options)
        self.run_root = run_root
        self.ssh = ssh
        self.label = f"node{rank} ({host})"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "host": self.host,
            "rank": self.rank,
            "python": self.python,
            "options": list(self.options),
            "run_root": self.run_root,
            "ssh": self.ssh,
        }

    # --- the Node protocol ----------------------------------------------------------------

    def probe(self, request: ProbeRequest) -> dict[str, Any]:
        return self._call(
            "probe",
            {"model_dir": request.model_dir, "ports": [list(pair) for pair in request.ports]},
        )

    def start(self, request: StartRequest) -> str:
        run_dir = f"{self.run_root}/{request.run_id}/node{request.rank}-{request.name}"
        self._call("start", {"dir": run_dir, "argv": list(request.argv), "env": dict(request.env)})
        return run_dir

    def run(self, handle: str, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        try:
            result = subprocess.run(
                self.ssh_argv(argv),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return 124, f"timed out after {timeout:.0f} s"
        return result.returncode, result.stdout + result.stderr

    def status(self, handle: str) -> ProcessState:
        data = self._call("status", {"dir": handle})
        return ProcessState(
            running=bool(data.get("running")), exit=data.get("exit"), gone=bool(data.get("gone"))
        )

    def follow(self, handle: str) -> Iterator[str]:
        process = subprocess.Popen(
            self.ssh_argv([self.python, "-c", agent_source(), "follow"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps({"dir": handle}).encode())
            process.stdin.close()
            for raw in process.stdout:
                yield raw.rstrip(b"\r\n").decode("utf-8", errors="replace")
        finally:
            if process.poll() is None:
                process.terminate()
            process.wait()

    def stop(self, handle: str, timeout: float) -> dict[str, Any] | None:
        data = self._call("stop", {"dir": handle, "timeout": timeout}, timeout=timeout + 30.0)
        if data.get("left"):
            raise NodeError(
                f"{self.label}: {data['left']} processes of {handle} survived SIGKILL",
                "look at them with ps on the node (uninterruptible I/O?)",
            )
        ending = data.get("exit")
        return ending if isinstance(ending, dict) else None

    # --- plumbing ---------------------------------------------------------------------------

    def ssh_argv(self, remote: Sequence[str]) -> list[str]:
        options = [item for option in (*BASE_OPTIONS, *self.options) for item in ("-o", option)]
        return [self.ssh, *options, self.host, "--", shlex.join(remote)]

    def _call(
        self, command: str, request: dict[str, Any], timeout: float = CALL_TIMEOUT
    ) -> dict[str, Any]:
        argv = self.ssh_argv([self.python, "-c", agent_source(), command])
        try:
            result = subprocess.run(
                argv,
                input=json.dumps(request),
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError:
            raise NodeError(f"{self.ssh} is not installed here", "install openssh-client") from None
        except subprocess.TimeoutExpired:
            raise NodeError(
                f"{self.label}: no answer to '{command}' within {timeout:.0f} s", SSH_HINT
            ) from None
        if result.returncode == 255:
            raise NodeError(f"{self.label}: ssh failed: {_last_line(result.stderr)}", SSH_HINT)
        data = _json_line(result.stdout)
        if data is None:
            raise NodeError(
                f"{self.label}: {self.python} did not answer: "
                f"{_last_line(result.stderr) or f'exit {result.returncode}'}",
                PYTHON_HINT,
            )
        if "error" in data:
            raise NodeError(f"{self.label}: {data['error']}", "see the node's message")
        return data


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _json_line(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except (ValueError, RecursionError):
                return None
            return data if isinstance(data, dict) else None
    return None
