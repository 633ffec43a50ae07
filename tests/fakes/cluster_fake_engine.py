"""Stands in for a vLLM rank in the multi-node tests that do not run the real engine.

Run as `python tests/fakes/cluster_fake_engine.py <the engine argv after the interpreter>`. The head
(no --headless) serves tests/fakes/openai_server.py on --host/--port; a headless worker prints
and waits; `ray start` registers itself in FAKE_RAY_DIR. FAKE_ENGINE in the environment picks a
misbehaviour: head-exits, head-hangs, head-core-dies, ray-worker-lost.
The real engine across two hosts is tests/integration/test_multinode_netns.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from tests.fakes.openai_server import FakeOpenAIServer


def value(argv: list[str], flag: str, default: str = "") -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


def fake_ray(argv: list[str], mode: str) -> None:
    """`ray start` (head or worker) registers itself as a file; the node count reads them."""
    members = Path(os.environ["FAKE_RAY_DIR"])
    if argv[0] == "-c":  # the launcher's count of live Ray nodes
        print(len(list(members.iterdir())))
        return
    role = "head" if "--head" in argv else "worker"
    print(f"fake ray {role} started", flush=True)
    if not (role == "worker" and mode == "ray-worker-lost"):
        (members / f"{role}-{os.getpid()}").touch()
    while True:
        time.sleep(1)


def main() -> None:
    argv = sys.argv[1:]
    mode = os.environ.get("FAKE_ENGINE", "ok")
    if argv[:2] == ["-m", "ray.scripts.scripts"] or (argv[0] == "-c" and "ray.init" in argv[1]):
        fake_ray(argv if argv[0] == "-c" else argv[2:], mode)
        return
    rank = value(argv, "--node-rank", "0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"fake rank {rank} up, interface {os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
    if "--headless" in argv:
        print(f"headless worker rank {rank} waiting for {value(argv, '--master-addr')}", flush=True)
        while True:
            time.sleep(1)
    if mode == "head-exits":
        print("RuntimeError: Engine core initialization failed.", flush=True)
        sys.exit(3)
    if mode == "head-hangs":
        while True:
            time.sleep(1)
    if mode == "head-core-dies":  # prints a real fatal start-up (FAKE_ENGINE_LOG), then hangs
        print(Path(os.environ["FAKE_ENGINE_LOG"]).read_text(encoding="utf-8"), flush=True)
        while True:
            time.sleep(1)
    fake = FakeOpenAIServer(
        api_key=os.environ.get("VLLM_API_KEY"),
        model=value(argv, "--served-model-name"),
        address=(value(argv, "--host", "127.0.0.1"), int(value(argv, "--port", "8000"))),
    )
    print("Starting vLLM API server 0 on http://...", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    fake.serve_forever()


if __name__ == "__main__":
    main()
