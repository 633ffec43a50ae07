"""The bare engine side of the time-to-READY benchmarks: `vllm serve` started with the command
line and environment sm120 renders for a plan, timed from process start to its first chat
answer (sm120's READY includes exactly that smoke test).

Both sides must hash to the same torch.compile cache entry, or one of them compiles and the
other does not: vLLM hashes every `VLLM_*` variable it knows into that key, `VLLM_API_KEY`
included, so the bare engine gets the API key the sm120 side uses, and not sm120's own
`VLLM_PYTHON`, which sm120 keeps out of the engine's environment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import httpx

from sm120.plan.resolve import PlanRequest, resolve
from sm120.render.argv import render_argv
from sm120.render.environment import render_env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def bare_ready(
    python: str, request: PlanRequest, cache: Path, key: str, log: Path | None = None
) -> float:
    """Seconds from `vllm serve` to its first answer, for `request` on a free port; the
    engine's output goes to `log` when given (sm120's engine writes a log too)."""
    port = free_port()
    plan = resolve(replace(request, port=port))
    argv = render_argv(plan, python=python)
    env = {**os.environ, **render_env(plan, api_key=key), "VLLM_CACHE_ROOT": str(cache)}
    env.pop("VLLM_PYTHON", None)
    sink = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    started = time.perf_counter()
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
        return time.perf_counter() - started
    finally:
        os.killpg(engine.pid, signal.SIGTERM)
        engine.wait(timeout=60)
        if not isinstance(sink, int):
            sink.close()
