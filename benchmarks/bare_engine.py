"""The bare engine side of the time-to-READY benchmarks: `vllm serve` started with the command
line and environment sm120 renders for a plan, timed from process start to its first chat
answer (sm120's READY includes exactly that smoke test).

Both sides must hash to the same torch.compile cache entry, or one of them compiles and the
other does not: vLLM hashes every `VLLM_*` variable it knows into that key, `VLLM_API_KEY`
included, so the bare engine gets the API key the sm120 side uses, and not sm120's own
`VLLM_PYTHON`, which sm120 keeps out of the engine's environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import httpx

from sm120.engine.runtime.native import SUPERVISOR_MODULE
from sm120.engine.runtime.processes import find_child_pid, group_members
from sm120.plan.resolve import PlanRequest, resolve
from sm120.render.argv import render_argv
from sm120.render.environment import render_env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def bare_ready(
    python: str,
    request: PlanRequest,
    cache: Path,
    key: str,
    log: Path | None = None,
    *,
    supervisor: Literal["pipe", "file"] | None = None,
    facts: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> float:
    """Seconds from `vllm serve` to its first answer, for `request` on a free port; the
    engine's output goes to `log` when given (sm120's engine writes a log too). `supervisor`
    starts it under sm120's supervisor, to tell the supervisor's share of a launch from the
    command's: "pipe" as `sm120 launch` does (the output through the supervisor's pipe into
    its log), "file" with the engine writing to `log` itself (the supervisor only its parent).
    `facts` receives the spawn time and the API process's scheduling facts (launch_gap.py).
    `env` replaces the engine's environment whole (an sm120 engine's, read from /proc: it
    names the same cache and key)."""
    port = free_port()
    plan = resolve(replace(request, port=port))
    argv = render_argv(plan, python=python)
    if env is None:
        env = {**os.environ, **render_env(plan, api_key=key), "VLLM_CACHE_ROOT": str(cache)}
        env.pop("VLLM_PYTHON", None)
    piped = supervisor == "pipe"
    sink = open(log, "wb") if log is not None and not piped else subprocess.DEVNULL  # noqa: SIM115
    if supervisor is not None:
        assert log is not None, "a supervised engine's output goes to a log"
        exit_file = log.with_suffix(".exit.json")
        # Without --log the supervisor's child inherits its stdout: the log file itself.
        own_log = ("--log", str(log)) if piped else ()
        argv = [
            sys.executable, "-m", SUPERVISOR_MODULE,
            "--exit-file", str(exit_file), *own_log, "--", *argv,
        ]  # fmt: skip
    started = time.perf_counter()
    if facts is not None:
        facts["spawned_at"] = time.time()
    engine = subprocess.Popen(
        argv, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if engine.poll() is not None:
                raise RuntimeError(f"bare engine exited with {engine.returncode}")
            time.sleep(0.25)
        answer = httpx.post(
            f"{base}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
            json={
                "model": plan.model.served_name,
                "max_tokens": 16,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Reply with exactly: READY"}],
            },
        )
        answer.raise_for_status()
        took = time.perf_counter() - started
        if facts is not None:
            api = engine.pid if supervisor is None else find_child_pid(engine.pid)
            facts.update(process_facts(api) if api else {})
        return took
    finally:
        os.killpg(engine.pid, signal.SIGTERM)
        engine.wait(timeout=60)
        # The whole group, as `sm120 stop` waits for it: an EngineCore still letting go of
        # its GPU memory would otherwise slow whichever start comes next.
        group_gone(engine.pid, timeout_s=60)
        if not isinstance(sink, int):
            sink.close()


def group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no live process of group `pgid` is left (zombies a container's init never
    reaps do not count, as for `sm120 stop`); SIGKILL what is left after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            return False
        time.sleep(0.05)
    return True


# Scheduling facts of a process that could make the same program start slower: its nice
# value, the CPUs it may run on, its cgroup, and its environment (values of secrets left out).
def process_facts(pid: int) -> dict[str, Any]:
    proc = Path("/proc") / str(pid)
    try:
        status = dict(
            line.split(":", 1) for line in (proc / "status").read_text().splitlines() if ":" in line
        )
        environ = (proc / "environ").read_bytes().split(b"\0")
        cgroup = (proc / "cgroup").read_text().strip()
        nice = os.getpriority(os.PRIO_PROCESS, pid)
    except OSError as exc:
        return {"facts_error": str(exc)}
    names = sorted(item.decode(errors="replace").split("=", 1)[0] for item in environ if item)
    shown = {}
    for item in environ:
        name, _, value = item.decode(errors="replace").partition("=")
        if name and "KEY" not in name and "TOKEN" not in name:
            shown[name] = value
    return {
        "api_pid": pid,
        "nice": nice,
        "cpus_allowed": status.get("Cpus_allowed_list", "").strip(),
        "cgroup": cgroup,
        "env_names": names,
        "env": shown,
        "tree": process_tree(pid),
    }


def process_tree(root: int) -> list[dict[str, Any]]:
    """The API process and its descendants: when each started (epoch, 10 ms ticks), the CPU
    each used (its own and its waited-for children's) and the time it spent runnable but
    waiting for a CPU. Same CPU over a longer start means waiting; more CPU means more work."""
    ticks = os.sysconf("SC_CLK_TCK")
    # The boot time from the uptime (10 ms steps): /proc/stat's btime is whole seconds.
    boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    found: list[dict[str, Any]] = []
    pending = [root]
    while pending:
        pid = pending.pop(0)
        proc = Path("/proc") / str(pid)
        try:
            stat = (proc / "stat").read_text()
            # Per thread: a process's own schedstat counts its main thread only.
            waited_ns = sum(
                int(task.read_text().split()[1]) for task in proc.glob("task/*/schedstat")
            )
            status = (proc / "status").read_text()
            children = [
                int(child)
                for task in proc.glob("task/*/children")
                for child in task.read_text().split()
            ]
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        switches = dict(
            (key.strip(), int(value))
            for key, value in (line.split(":", 1) for line in status.splitlines() if ":" in line)
            if key.endswith("ctxt_switches")
        )
        found.append({
            "pid": pid,
            "name": name,
            "started_at": round(boot + int(fields[19]) / ticks, 2),
            "threads": int(fields[17]),
            "cpu_s": round((int(fields[11]) + int(fields[12])) / ticks, 2),
            "children_cpu_s": round((int(fields[13]) + int(fields[14])) / ticks, 2),
            "runqueue_wait_s": round(waited_ns / 1e9, 2),
            **switches,
        })  # fmt: skip
        pending += children
    return found
