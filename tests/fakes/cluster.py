"""Stand-ins for the two things multi-node unit tests cannot have: a remote host and a real
vLLM rank. `ssh` becomes a script that runs the remote command right here (the agent, the
quoting and the processes are all real), and the engine's Python runs the agent for real but
tests/fakes/cluster_fake_engine.py in place of vLLM."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# Run by the engine-python stand-in as a script, in place of vLLM.
FAKE_ENGINE = Path(__file__).resolve().parent / "cluster_fake_engine.py"
FAKE_SSH = """#!/bin/bash
# ssh stand-in: drops the options, "connects" to HOST by running the command here.
while [ $# -gt 0 ]; do
  case "$1" in
    -o) shift 2;;
    --) shift; break;;
    -*) shift;;
    *) host="$1"; shift;;
  esac
done
cmd="$1"
# One line per call: the host and the last word (the agent's command: start, stop, ...).
echo "$host ${cmd##* }" >> "$FAKE_SSH_LOG"
printf '%s\n' "$host $cmd" >> "$FAKE_SSH_LOG.full"
# HOST down: every call fails; HOST.start: only starting processes there fails.
down="$FAKE_SSH_DOWN/$host"
if [ -e "$down" ] || { [ -e "$down.start" ] && [ "${cmd##* }" = start ]; }; then
  echo "ssh: connect to host $host port 22: Connection refused" >&2
  exit 255
fi
exec sh -c "$1"
"""
FAKE_PYTHON = """#!/bin/bash
# The engine's Python stand-in: the sm120 agent runs on the real interpreter, engine commands
# run the fake engine.
if [ "$1" = "-c" ] && [[ "$2" == *"sm120 runs on each node"* ]]; then exec {python} "$@"; fi
exec {python} {engine} "$@"
"""


@dataclass
class FakeCluster:
    bin: Path
    python: Path
    ssh_log: Path
    down: Path
    run_root: Path
    model: Path

    def take_down(self, host: str) -> None:
        (self.down / host).touch()

    def ssh_calls(self) -> list[str]:
        return self.ssh_log.read_text().splitlines() if self.ssh_log.exists() else []

    def ssh_command_lines(self) -> str:
        """Everything every ssh call carried on its command line."""
        full = self.ssh_log.with_name(self.ssh_log.name + ".full")
        return full.read_text() if full.exists() else ""


def make_fake_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    python = bin_dir / "engine-python"
    python.write_text(FAKE_PYTHON.format(python=sys.executable, engine=FAKE_ENGINE))
    for script in (ssh, python):
        script.chmod(0o755)
    down = tmp_path / "down"
    down.mkdir()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    cluster = FakeCluster(bin_dir, python, tmp_path / "ssh.log", down, tmp_path / "run", model)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_LOG", str(cluster.ssh_log))
    monkeypatch.setenv("FAKE_SSH_DOWN", str(down))
    monkeypatch.setenv("SM120_NODE_RUN_ROOT", str(cluster.run_root))
    return cluster
