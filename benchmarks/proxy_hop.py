"""The gateway's own hop, without an engine's noise: a simulated engine (a raw asyncio server
answering every request with a chunked event stream) is sent the same streamed request three
ways, in rotation, from a plain blocking socket: straight, through `python -m sm120.gateway`
(the front and its fast path, sm120.gateway.front), and through the gateway's aiohttp
application listening alone, as the gateway did before the front. The difference in time to
the first event is what each adds to a first token.

    python benchmarks/proxy_hop.py [--pairs 400] [--prefill-ms 0] [--chunks 32] [--baseline TREE]

`--baseline TREE` adds a side in the same rotation: the gateway of another checkout (e.g.
main before a change to the front), so a change's cost is measured side by side.
"gateway, keys on" sends a person's key with limits among --keys others (default 1,000):
the key lookup, the limits, the turns and the usage record, against "gateway"'s admin key.
"gateway, engine on a unix socket" is a gateway whose backend is the same engine on its unix
socket (a warded deployment's, Backend.socket), beside "direct, unix socket": what the
gateway adds either way, TCP or socket to the engine, in one run. "ward" is sm120's engine
ward (sm120/engine/ward.py) holding a port in front of that socket, as for a warded
deployment: what it adds over "direct, unix socket" is what a client of the deployment's port
pays for it.

Seconds on any machine; the H200 run of benchmarks/gateway_overhead.py, against a real engine,
is the one issue 36's goal is judged by.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bare_engine import free_port  # noqa: E402

KEY = "proxy-hop-key"

ENGINE = r"""
import asyncio, sys

PREFILL_S = float(sys.argv[2]) / 1000
CHUNKS = int(sys.argv[3])
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n\r\n")
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"word"}}]}\n\n'
CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
DONE = b"data: [DONE]\n\n"
END = b"%x\r\n%s\r\n0\r\n\r\n" % (len(DONE), DONE)

async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            writer.write(HEAD)
            await asyncio.sleep(PREFILL_S)
            for _ in range(CHUNKS):
                writer.write(CHUNK)
                await asyncio.sleep(0)
            writer.write(END)
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()

async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]))
    # The same engine on a unix socket too, as a warded deployment's engine listens.
    on_socket = await asyncio.start_unix_server(serve, sys.argv[4])
    async with server, on_socket:
        await asyncio.gather(server.serve_forever(), on_socket.serve_forever())

asyncio.run(main())
"""


def request_bytes(key: str) -> bytes:
    body = json.dumps(
        {"model": "sim", "messages": [{"role": "user", "content": "hi " * 200}], "stream": True}
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def one(sock: socket.socket, request: bytes) -> tuple[float, float]:
    """(seconds to the first event, seconds to the stream's end) on a kept-alive socket."""
    started = time.perf_counter()
    sock.sendall(request)
    seen = b""
    first = None
    while True:
        data = sock.recv(65536)
        if not data:
            raise SystemExit("the server closed the connection")
        seen += data
        if first is None and b"data: {" in seen:
            first = time.perf_counter() - started
        if seen.endswith(b"0\r\n\r\n") and b"[DONE]" in seen:
            return first or float("nan"), time.perf_counter() - started


def connect(port: int | str) -> socket.socket:
    """A TCP socket to a port, or a unix socket's (a path)."""
    for _ in range(1200):  # a minute: a gateway's start on a loaded machine takes seconds
        try:
            if isinstance(port, str):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(port)
                except OSError:
                    sock.close()
                    raise
                return sock
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


# The gateway as it listened before the front: the same application, on its own socket.
APPLICATION_ALONE = r"""
import asyncio, sys
from pathlib import Path
import aiohttp
from aiohttp import web
from sm120.gateway.proxy import build_app, discoverer
from sm120.gateway.server import app_runner, run_event_loop
from sm120.gateway.static import load_static_backends, static_discover
from sm120.gateway.swap import Swapper, SwapPolicy
from sm120.gateway.actions import EngineActions

async def main():
    key = Path(sys.argv[2]).read_text().strip()
    find = static_discover(load_static_backends(Path(sys.argv[1])))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                     cookie_jar=aiohttp.DummyCookieJar()) as session:
        swapper = Swapper(SwapPolicy(), EngineActions(session), discoverer(find))
        runner = app_runner(build_app(key, swapper, session))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", int(sys.argv[3])).start()
        await asyncio.Event().wait()

run_event_loop(main())
"""


def gateway_argv(work: Path, port: int, *extra: str, backends: str = "backends.json") -> list[str]:
    return [sys.executable, "-m", "sm120.gateway", "--port", str(port),
            "--backends", str(work / backends),
            "--key-file", str(work / "gateway_key"), *extra]  # fmt: skip


def keyed_home(home: Path, keys: int) -> str:
    """A gateway folder whose store holds `keys` keys and the measured one, with limits (so
    every request pays for the HMAC, the lookup, the limits and the usage record)."""
    from sm120.gateway.keys import KeyEntry, KeyStore, add_keys

    folder = home / "gateway"
    folder.mkdir(parents=True, mode=0o700)
    store = KeyStore(folder)
    add_keys(store, [KeyEntry(f"teammate-{n}", "", rpm=600) for n in range(keys)])
    measured = KeyEntry("bench", "", rpm=10**6, tpm=10**9, concurrency=1000)
    return add_keys(store, [measured])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=400)
    # 0 by default: the simulated engine's sleep wakes on a 1 ms timer grid, whose phase
    # moves its own noise into the figure.
    parser.add_argument("--prefill-ms", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--baseline", type=Path, help="another checkout's gateway, side by side")
    parser.add_argument("--keys", type=int, default=1000, help="other keys beside the measured")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sm120-proxy-hop-"))
    engine_port, gateway_port, alone_port = free_port(), free_port(), free_port()
    baseline_port = free_port()
    unlogged_port = free_port()
    keyed_port = free_port()
    (work / "engine_key").write_text("engine-key\n")
    (work / "gateway_key").write_text(KEY + "\n")
    backends = {"model": "sim", "service": "sim", "url": f"http://127.0.0.1:{engine_port}",
                "key_file": str(work / "engine_key")}  # fmt: skip
    (work / "backends.json").write_text(json.dumps({"backends": [backends]}))
    # The same engine on its unix socket, as the gateway reaches a warded deployment's
    # (Backend.socket): the URL gives the Host header only.
    engine_socket = str(work / "engine.sock")
    on_socket = {**backends, "socket": engine_socket}
    (work / "backends-socket.json").write_text(json.dumps({"backends": [on_socket]}))
    socket_port = free_port()
    env = {**os.environ, "SM120_HOME": str(work / "home")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    engine = [sys.executable, "-c", ENGINE, str(engine_port), str(args.prefill_ms),
              str(args.chunks), engine_socket]  # fmt: skip
    alone = [sys.executable, "-c", APPLICATION_ALONE, str(work / "backends.json"),
             str(work / "gateway_key"), str(alone_port)]  # fmt: skip
    # Two gateways: the second writes no access log, so the log's cost is their difference.
    unlogged_env = {**env, "SM120_HOME": str(work / "home-unlogged")}
    argvs = (engine, gateway_argv(work, gateway_port), alone)
    processes = [subprocess.Popen(argv, env=env) for argv in argvs]
    if args.baseline is not None:
        baseline_env = {**env, "PYTHONPATH": str(args.baseline.resolve()),
                        "SM120_HOME": str(work / "baseline-home")}  # fmt: skip
        baseline_argv = gateway_argv(work, baseline_port)
        processes.append(subprocess.Popen(baseline_argv, env=baseline_env, cwd=args.baseline))
    processes.append(
        subprocess.Popen(gateway_argv(work, unlogged_port, "--no-access-log"), env=unlogged_env)
    )
    socket_env = {**env, "SM120_HOME": str(work / "home-socket")}
    socket_argv = gateway_argv(work, socket_port, backends="backends-socket.json")
    processes.append(subprocess.Popen(socket_argv, env=socket_env))
    ward_port = free_port()
    ward = [sys.executable, "-m", "sm120.engine.ward", "--host", "127.0.0.1", "--port",
            str(ward_port), "--socket", engine_socket,
            "--key-file", str(work / "engine_key")]  # fmt: skip
    processes.append(subprocess.Popen(ward, env=env, stdout=subprocess.DEVNULL))
    keyed_env = {**env, "SM120_HOME": str(work / "home-keyed")}
    person_key = keyed_home(work / "home-keyed", args.keys)
    processes.append(subprocess.Popen(gateway_argv(work, keyed_port), env=keyed_env))
    try:
        sides = {
            "direct": (connect(engine_port), request_bytes("engine-key")),
            "gateway": (connect(gateway_port), request_bytes(KEY)),
            "gateway without access log": (connect(unlogged_port), request_bytes(KEY)),
            "application alone": (connect(alone_port), request_bytes(KEY)),
            "gateway, keys on": (connect(keyed_port), request_bytes(person_key)),
            "direct, unix socket": (connect(engine_socket), request_bytes("engine-key")),
            "gateway, engine on a unix socket": (connect(socket_port), request_bytes(KEY)),
            "ward": (connect(ward_port), request_bytes("engine-key")),
        }
        if args.baseline is not None:
            sides["baseline gateway"] = (connect(baseline_port), request_bytes(KEY))
        for sock, request in sides.values():
            for _ in range(20):  # unmeasured: pools, caches and the CPU's clocks warm
                one(sock, request)
        samples: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
        names = list(sides)
        for index in range(args.pairs):
            # Each side goes first, second, ... and last equally often.
            shift = index % len(names)
            for side in names[shift:] + names[:shift]:
                samples[side].append(one(*sides[side]))
    finally:
        for process in processes:
            process.terminate()
            process.wait()
    first = {side: statistics.median(r[0] for r in runs) for side, runs in samples.items()}
    whole = {side: statistics.median(r[1] for r in runs) for side, runs in samples.items()}
    report: dict[str, object] = {
        "pairs": args.pairs, "prefill_ms": args.prefill_ms, "chunks": args.chunks,
        "first_event_ms": {side: round(v * 1000, 3) for side, v in first.items()},
        "whole_stream_ms": {side: round(v * 1000, 3) for side, v in whole.items()},
    }  # fmt: skip
    for side in [name for name in sides if not name.startswith("direct")]:
        report[f"{side} adds to the first event, ms"] = round(
            (first[side] - first["direct"]) * 1000, 3
        )
    # The gateway's own hop either way: each against the engine straight on the same transport.
    report["gateway adds to the first event over the socket (vs direct on it), ms"] = round(
        (first["gateway, engine on a unix socket"] - first["direct, unix socket"]) * 1000, 3
    )
    report["ward adds to the first event over the socket (vs direct on it), ms"] = round(
        (first["ward"] - first["direct, unix socket"]) * 1000, 3
    )
    report["ward, whole stream ratio (ward / direct on the socket)"] = round(
        whole["ward"] / whole["direct, unix socket"], 4
    )
    report["the socket against TCP for the gateway's own hop, first event, ms"] = round(
        (first["gateway, engine on a unix socket"] - first["gateway"]) * 1000, 3
    )
    report["gateway, whole stream ratio (engine on a socket / on TCP)"] = round(
        whole["gateway, engine on a unix socket"] / whole["gateway"], 4
    )
    report["access log costs the first event, ms"] = round(
        (first["gateway"] - first["gateway without access log"]) * 1000, 3
    )
    report["access log: whole stream ratio (logged / unlogged)"] = round(
        whole["gateway"] / whole["gateway without access log"], 4
    )
    lines = (work / "home" / "gateway" / "access.log").read_text().count("\n")
    report["access log lines written"] = lines
    report["keys on costs the first event, ms"] = round(
        (first["gateway, keys on"] - first["gateway"]) * 1000, 3
    )
    report["keys"] = args.keys
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
