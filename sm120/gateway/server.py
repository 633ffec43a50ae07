"""The gateway process: holds the locked pid file while it runs, says where it listens, and
serves until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web

from sm120.core.errors import SM120Error
from sm120.core.pidlock import PidLock
from sm120.engine.secrets import MOUNTED_KEY_REMEDY, read_api_key
from sm120.engine.state import private_dir
from sm120.gateway import proxy
from sm120.gateway.access_log import AccessLog
from sm120.gateway.actions import EngineActions
from sm120.gateway.admission import Team
from sm120.gateway.aliases import as_table
from sm120.gateway.backends import Backend, discover
from sm120.gateway.config import GatewayConfig
from sm120.gateway.files import (
    GatewayAddress,
    GatewayFiles,
    ensure_gateway_key,
    running_gateway,
    save_address,
)
from sm120.gateway.front import serving_front
from sm120.gateway.keys import KeyRing, KeyStore
from sm120.gateway.normalize import normalize
from sm120.gateway.proxy import build_app, discoverer
from sm120.gateway.requestlog import RequestLog
from sm120.gateway.sessions import EngineSessions, client_session
from sm120.gateway.static import load_static_backends, static_discover
from sm120.gateway.swap import SwapActions, Swapper, SwapPolicy
from sm120.gateway.usage import Record, UsageWriter


class GatewayRunning(SM120Error):
    """Another gateway holds the pid file."""


class GatewayKeyMissing(SM120Error):
    """--key-file names no readable key."""


def serve(config: GatewayConfig, files: GatewayFiles) -> None:
    """Run the gateway in this process until SIGTERM/SIGINT."""
    # Files named on the command line are checked before anything is locked or written.
    find, given_key = _backends_and_key(config)
    lock = PidLock(files.pid)
    if not lock.acquire():
        held = running_gateway(files)
        AccessLog(files.access_log).event(
            "refusal", reason="another gateway runs", pid=held[0] if held else None
        )
        raise GatewayRunning(
            f"a gateway already runs (pid {held[0] if held else '?'})",
            "see 'sm120 gateway status', or 'sm120 gateway stop' first",
        )
    try:
        # Made under the lock: two starts racing must not each write a different key.
        api_key = given_key or ensure_gateway_key(files)
        run_event_loop(_serve(config, files, find, api_key))
    finally:
        files.address.unlink(missing_ok=True)
        lock.release()


def _backends_and_key(
    config: GatewayConfig,
) -> tuple[Callable[[], dict[str, Backend]], str | None]:
    """Static mode reads both from files and fails at once when they are unusable; otherwise
    the state directory is read per request, and no key is given (the gateway keeps its own)."""
    find: Callable[[], dict[str, Backend]] = discover
    if config.backends_file is not None:
        find = static_discover(load_static_backends(config.backends_file))
    if config.key_file is None:
        return find, None
    key = read_api_key(str(config.key_file), MOUNTED_KEY_REMEDY)
    if key is None:
        raise GatewayKeyMissing(
            f"the gateway key file {config.key_file} is missing or empty",
            "mount the key file (sm120 compose writes secrets/gateway_key)",
        )
    return find, key


def _normalized(path: str, body: dict[str, Any]) -> dict[str, Any]:
    return normalize(body, path).body


def app_runner(app: web.Application) -> web.AppRunner:
    """keepalive_timeout also bounds a connection that never completes its request head
    (aiohttp arms it when the connection opens): no slow-header or idle pile-up."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=proxy.IDLE_CONNECTION_S)


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """uvloop where it is installed: the relay's per-chunk cost is mostly the event loop's."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


async def _serve(
    config: GatewayConfig,
    files: GatewayFiles,
    find: Callable[[], dict[str, Backend]],
    api_key: str,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, stop.set)
    # No pool limit: every streamed answer holds its upstream connection until it ends.
    async with client_session(aiohttp.TCPConnector(limit=0)) as session:
        # The warded engines' socket sessions beside it, shared by the relay and the swaps.
        sessions = EngineSessions(session)
        policy = SwapPolicy(max_awake=config.max_awake, wait_s=config.swap_wait_s)
        access = AccessLog(files.access_log)
        actions = LoggedActions(EngineActions(sessions), access)
        swapper = Swapper(policy, actions, discoverer(find))
        rewrite = _normalized if config.normalize_prompts else None
        logged = access if config.access_log else None
        team = team_of(config, files, api_key, loop)
        app = build_app(api_key, swapper, sessions, config.aliases, rewrite, logged, team)
        runner = app_runner(app)
        await runner.setup()
        try:
            # The full application answers only what the front hands over (sm120.gateway.front),
            # on a socket no other machine and no file system path can reach.
            internal = f"\0sm120-gateway-{os.getpid()}-{secrets.token_hex(8)}"
            await web.UnixSite(runner, internal).start()
            async with serving_front(app, api_key, internal, config.host, config.port):
                address = GatewayAddress(
                    config.host, config.port, os.getpid(), time.time(), config.max_awake,
                    as_table(config.aliases),
                )  # fmt: skip
                save_address(files, address)
                access.event(
                    "start", host=config.host, port=config.port, pid=os.getpid(),
                    max_awake=config.max_awake, aliases=len(config.aliases),
                )  # fmt: skip
                await stop.wait()
        finally:
            await runner.cleanup()
            await sessions.close()
            access.event("stop", pid=os.getpid())
            access.flush()
            if team.usage is not None:
                await asyncio.to_thread(team.usage.close)


def team_of(
    config: GatewayConfig, files: GatewayFiles, api_key: str, loop: asyncio.AbstractEventLoop
) -> Team:
    """The keys (the store in the gateway's folder, the admin key), and the usage writer,
    whose parsed records hop back onto the loop (limits and counters live there)."""
    ring = KeyRing(api_key, KeyStore(files.root))
    log = None
    if config.request_log:
        private_dir(files.request_log.parent)
        log = RequestLog(files.request_log)
    writer = UsageWriter(files.usage_db if config.record_usage else None, request_log=log)
    team = Team(ring, writer, policy=config.turns)

    def hop(record: Record) -> None:
        loop.call_soon_threadsafe(team.recorded, record)

    writer.on_record = hop
    team.meter.dropped = lambda: writer.dropped
    writer.start()
    return team


class LoggedActions:
    """The swapper's actions, each one a line in the access log (what a swap did, and when)."""

    def __init__(self, actions: SwapActions, access: AccessLog) -> None:
        self._actions = actions
        self._access = access

    async def stop(self, backend: Backend) -> None:
        self._access.event("swap", action="stop", deployment=backend.deployment)
        await self._actions.stop(backend)

    async def start(self, backend: Backend, timeout_s: float) -> None:
        self._access.event("swap", action="start", deployment=backend.deployment)
        await self._actions.start(backend, timeout_s)

    async def sleep(self, backend: Backend) -> None:
        self._access.event("swap", action="sleep", deployment=backend.deployment)
        await self._actions.sleep(backend)

    async def wake(self, backend: Backend) -> None:
        self._access.event("swap", action="wake", deployment=backend.deployment)
        await self._actions.wake(backend)

    async def is_sleeping(self, backend: Backend) -> bool:
        return await self._actions.is_sleeping(backend)
