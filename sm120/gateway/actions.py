"""The real swap actions: sm120's own stop and start (restart.py) run off the event loop, and
vLLM's sleep-mode endpoints.

vLLM serves POST /sleep?level=1, POST /wake_up and GET /is_sleeping only when the engine was
started with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/serve/__init__.py
registers them with the dev routes). They sit outside /v1, so vLLM's API key does not guard
them: the engine's port must stay on loopback, as sm120 binds it unless told otherwise. A
warded engine's ward does not pass them at all: they go to its unix socket (Backend.socket),
which only sm120 reaches.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from sm120.doctor.host_checks import parse_meminfo
from sm120.engine.state import load_state
from sm120.gateway.backends import Backend
from sm120.gateway.restart import start_for_swap, stop_for_swap
from sm120.gateway.sessions import EngineSessions, engine_sessions
from sm120.gateway.swap import SwapFailed
from sm120.plan.fit.sleep import sleep_shortfall, weights_bytes

SLEEP_LEVEL = 1
SLEEP_CALL_TIMEOUT_S = 300.0
# Asked on every routed request for a sleep-mode backend: a loopback call, or it is awake.
IS_SLEEPING_TIMEOUT_S = 2.0


class EngineActions:
    """SwapActions on real deployments."""

    def __init__(self, session: aiohttp.ClientSession | EngineSessions) -> None:
        """`session`: the application's (proxy.SESSIONS), so that a socket's session is
        shared and closed with it; a plain session keeps socket sessions of its own."""
        self.sessions = engine_sessions(session)

    async def stop(self, backend: Backend) -> None:
        await asyncio.to_thread(stop_for_swap, backend.deployment)

    async def start(self, backend: Backend, timeout_s: float) -> None:
        await asyncio.to_thread(start_for_swap, backend.deployment, timeout_s)

    async def sleep(self, backend: Backend) -> None:
        shortfall = await asyncio.to_thread(host_ram_shortfall, backend)
        if shortfall:
            raise SwapFailed(
                f"cannot put '{backend.model}' to sleep: {shortfall}",
                "lower --max-awake's demand or free host memory",
            )
        await self._post(backend, f"/sleep?level={SLEEP_LEVEL}")

    async def wake(self, backend: Backend) -> None:
        await self._post(backend, "/wake_up")

    async def is_sleeping(self, backend: Backend) -> bool:
        """What the engine says; an engine that cannot say (no dev routes, not up) is taken
        as awake, and a request to it finds out."""
        timeout = aiohttp.ClientTimeout(total=IS_SLEEPING_TIMEOUT_S)
        try:
            async with self.sessions.for_backend(backend).get(
                backend.base_url + "/is_sleeping", headers=_auth(backend), timeout=timeout
            ) as answer:
                if answer.status != 200:
                    return False
                return bool((await answer.json()).get("is_sleeping"))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return False

    async def _post(self, backend: Backend, path: str) -> None:
        timeout = aiohttp.ClientTimeout(total=SLEEP_CALL_TIMEOUT_S)
        try:
            async with self.sessions.for_backend(backend).post(
                backend.base_url + path, headers=_auth(backend), timeout=timeout
            ) as answer:
                if answer.status == 404:
                    raise SwapFailed(
                        f"deployment {backend.deployment} has no {path.split('?')[0]} endpoint",
                        "launch it with --set enable-sleep-mode=true and "
                        "--set env.VLLM_SERVER_DEV_MODE=1",
                    )
                if answer.status != 200:
                    raise SwapFailed(
                        f"{path} on deployment {backend.deployment} answered {answer.status}",
                        "see 'sm120 logs --name " + backend.deployment + "'",
                    )
        except aiohttp.ClientError as exc:
            raise SwapFailed(
                f"{path} on deployment {backend.deployment} failed: {exc}",
                "see 'sm120 status'",
            ) from None


def _auth(backend: Backend) -> dict[str, str]:
    return {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}


def host_ram_shortfall(backend: Backend, meminfo: Path = Path("/proc/meminfo")) -> str | None:
    """Why host RAM cannot take the backend's weights when it sleeps, or None."""
    state = load_state(backend.deployment)
    if state is None or not state.model_dir:
        return None
    available = parse_meminfo(meminfo.read_text(encoding="utf-8")).get("MemAvailable")
    if available is None:
        return None
    return sleep_shortfall(weights_bytes(Path(state.model_dir)), available)
