"""The P2P / all-reduce probe. Runs inside the engine's own Python, never in sm120's.

Only the standard library and torch are used: sm120 is not installed in the engine's
environment. sm120/doctor/p2p.py starts it as `python p2p_probe.py --world N --port P` in a
new process group and prints nothing itself; this script prints one JSON object per line:

  {"event": "begin", "step": NAME}                 before each step (its timer starts here)
  {"event": "end", "step": NAME, "ok": ..., ...}   after it
  {"event": "done"}                                at the end

Steps: "torch" (import torch, find the devices), "copy GPUa->GPUb" for every ordered pair of
visible GPUs (CUDA only: a copy through peer access, verified, with its bandwidth), then
"all-reduce" over N ranks (NCCL on GPUs, gloo on CPU). The ranks are child processes in this
script's process group, so killing the group ends every one of them.

SM120_TEST_P2P_FAULT is for tests only: "hang" keeps rank 1 out of the all-reduce after the
process group is up (as a broken P2P transport does), "wrong" corrupts its contribution (and,
on GPUs, the copies).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

FAULT_ENV = "SM120_TEST_P2P_FAULT"
COPY_REPEATS = 5


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--backend", default=None)
    args = parser.parse_args()
    if args.rank is not None:
        return run_rank(args.rank, args.world, args.port, args.backend)
    emit(event="begin", step="torch")
    torch = importlib.import_module("torch")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if gpus >= 2 else "gloo"
    emit(event="end", step="torch", ok=True, torch=torch.__version__, gpus=gpus, backend=backend)
    if backend == "nccl":
        for src in range(gpus):
            for dst in range(gpus):
                if src != dst:
                    copy_between(torch, src, dst, args.mib)
    all_reduce(args.world, args.port, backend)
    emit(event="done")
    return 0


def copy_between(torch: Any, src: int, dst: int, mib: int) -> None:
    step = f"copy GPU{src}->GPU{dst}"
    emit(event="begin", step=step)
    count = mib * 1024 * 1024 // 4
    try:
        peer = bool(torch.cuda.can_device_access_peer(src, dst))
        data = torch.arange(count, device=f"cuda:{src}", dtype=torch.float32)
        target = torch.empty(count, device=f"cuda:{dst}", dtype=torch.float32)
        target.copy_(data)
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        started = time.perf_counter()
        for _ in range(COPY_REPEATS):
            target.copy_(data)
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        seconds = time.perf_counter() - started
        if os.environ.get(FAULT_ENV) == "wrong":
            target[0] += 1
        expected = torch.arange(count, device=f"cuda:{dst}", dtype=torch.float32)
        same = bool(torch.equal(target, expected))
    except Exception as exc:  # a CUDA error names the failure; the parent reads it
        emit(event="end", step=step, ok=False, error=f"{type(exc).__name__}: {exc}")
        return
    gbps = COPY_REPEATS * count * 4 / seconds / 1e9
    emit(event="end", step=step, ok=same, peer_access=peer, gbps=round(gbps, 2), verified=same)


def all_reduce(world: int, port: int, backend: str) -> None:
    emit(event="begin", step="all-reduce")
    started = time.perf_counter()
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                *("--world", str(world), "--port", str(port)),
                *("--rank", str(rank), "--backend", backend),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    answers = [rank.communicate()[0] for rank in ranks]
    results = [_last_json(text) for text in answers]
    ok = all(result.get("ok") is True for result in results)
    errors = [result["error"] for result in results if result.get("error")]
    emit(
        event="end",
        step="all-reduce",
        ok=ok,
        backend=backend,
        ranks=world,
        seconds=round(time.perf_counter() - started, 3),
        got=[result.get("got") for result in results],
        expected=world * (world + 1) / 2,
        error=errors[0] if errors else None,
    )


def run_rank(rank: int, world: int, port: int, backend: str) -> int:
    torch = importlib.import_module("torch")
    dist = importlib.import_module("torch.distributed")
    fault = os.environ.get(FAULT_ENV)
    try:
        device = f"cuda:{rank}" if backend == "nccl" else "cpu"
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(hours=1),  # the parent's step timeout is the one that counts
        )
        value = float(rank + 1)
        if fault == "wrong" and rank == 1:
            value += 1.0
        if fault == "hang" and rank == 1:
            time.sleep(3600)
        tensor = torch.full((1024,), value, device=device)
        dist.all_reduce(tensor)
        got = float(tensor[0].item())
        expected = world * (world + 1) / 2
        uniform = bool(torch.all(tensor == tensor[0]).item())
        emit(rank=rank, ok=uniform and got == expected, got=got)
        dist.destroy_process_group()
    except Exception as exc:
        emit(rank=rank, ok=False, error=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return {"ok": False, "error": "the rank printed no result"}


if __name__ == "__main__":
    sys.exit(main())
