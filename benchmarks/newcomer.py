"""A newcomer's first commands, as the README gives them, in a fresh home: no engine, no pip
or vLLM caches. Times the first run and a warm one, weighs the engine, runs the commands the
README names after it, and checks the README's quickstart statements against what it saw:
times within 2x, disk within 20%. Exit 1 when a statement no longer holds.

    python benchmarks/newcomer.py --out /tmp/newcomer [--record]

It costs what it measures (on a fresh 2-core machine about 4 minutes and 3.4 GiB, the engine
downloaded), so it is a benchmark, not a CI test: CI checks the README's statements against
the measurements this script recorded (benchmarks/results/newcomer.json, written with
--record) in tests/cli/test_readme_quickstart.py, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RECORDED = REPO / "benchmarks" / "results" / "newcomer.json"
TIME_FACTOR = 2.0  # a stated time holds while the measured one is within 2x of it
DISK_SHARE = 0.20  # a stated size holds within 20%
GIB = 1 << 30


@dataclass(frozen=True)
class Claims:
    """What the README's quickstart states, in numbers."""

    first_run_s: float
    engine_gib: float
    warm_s: float
    command: str


def quickstart(readme: str) -> str:
    start = readme.index("## Quickstart")
    end = readme.index("\n## ", start + 1)
    return readme[start:end]


def readme_claims(readme: str) -> Claims:
    """The figures the quickstart states; a ValueError names the one it no longer states."""
    text = " ".join(quickstart(readme).split())
    patterns = {
        "first run": r"first run takes about (\d+) minutes",
        "engine size": r"engine, (\d+(?:\.\d+)?) GiB",
        "warm start": r"later launches are ready in about (\d+) s",
    }
    found = {}
    for what, pattern in patterns.items():
        match = re.search(pattern, text)
        if match is None:
            raise ValueError(f"the README's quickstart no longer states the {what} (/{pattern}/)")
        found[what] = float(match.group(1))
    block = re.search(r"```bash\n(.+?)\n```", quickstart(readme), re.S)
    if block is None:
        raise ValueError("the README's quickstart has no command block")
    return Claims(
        first_run_s=found["first run"] * 60,
        engine_gib=found["engine size"],
        warm_s=found["warm start"],
        command=block.group(1).strip(),
    )


def broken_claims(claims: Claims, measured: dict[str, Any]) -> list[str]:
    """Each README statement the measurements contradict, in words."""
    broken = []
    for what, stated, seen in (
        ("first run", claims.first_run_s, measured["first_run_s"]),
        ("warm start", claims.warm_s, measured["warm_s"]),
    ):
        if not stated / TIME_FACTOR <= seen <= stated * TIME_FACTOR:
            broken.append(f"{what}: README says {stated:.0f}s, measured {seen:.0f}s")
    engine_gib = measured["engine_bytes"] / GIB
    if abs(engine_gib - claims.engine_gib) > DISK_SHARE * claims.engine_gib:
        broken.append(f"engine: README says {claims.engine_gib} GiB, measured {engine_gib:.2f}")
    return broken


def disk_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def run(command: str, cwd: Path, env: dict[str, str], log: Path) -> float:
    started = time.perf_counter()
    with log.open("ab") as sink:
        sink.write(f"$ {command}\n".encode())
        sink.flush()
        done = subprocess.run(
            ["bash", "-c", command], cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"'{command}' exited {done.returncode}; see {log}")
    return took


def fresh_env(home: Path) -> dict[str, str]:
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "LANG": "C.UTF-8", "NO_COLOR": "1"}
    # pip's own configuration (an index mirror, a wheel folder) is the machine's, not a cache.
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def measure(out: Path) -> dict[str, Any]:
    claims = readme_claims((REPO / "README.md").read_text(encoding="utf-8"))
    home = Path(tempfile.mkdtemp(prefix="sm120-newcomer-"))
    checkout = home / "sm120"
    checkout.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(checkout)], input=archive.stdout, check=True)
    env = fresh_env(home)
    log = out / "newcomer.log"
    # Without a terminal launch asks nobody: the README says to pass --yes then.
    first = claims.command.replace("sm120 launch tiny", "sm120 launch tiny --yes")
    activate = ". .venv/bin/activate && "
    measured: dict[str, Any] = {"command": first}
    measured["first_run_s"] = run(first, checkout, env, log)
    measured["engine_bytes"] = disk_bytes(home / ".cache" / "sm120" / "engines")
    # What the README names next; doctor too, which must know the port is its deployment's.
    after_first = ('sm120 chat "hello"', "sm120 status", "sm120 logs -n 20", "sm120 doctor tiny")
    for after in (*after_first, "sm120 stop"):
        run(activate + after, checkout, env, log)
    measured["warm_s"] = run(activate + "sm120 launch tiny --yes", checkout, env, log)
    run(activate + "sm120 stop", checkout, env, log)
    measured["home_bytes"] = disk_bytes(home)
    measured["broken"] = broken_claims(claims, measured)
    shutil.rmtree(home, ignore_errors=True)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--record", action="store_true", help=f"write {RECORDED.name}")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    measured = measure(args.out)
    measured["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    measured["machine"] = f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    text = json.dumps(measured, indent=2) + "\n"
    (args.out / "newcomer.json").write_text(text)
    if args.record:
        RECORDED.write_text(text)
    print(text)
    for line in measured["broken"]:
        print(f"README no longer true: {line}", file=sys.stderr)
    sys.exit(1 if measured["broken"] else 0)


if __name__ == "__main__":
    main()
