"""`GET /v1/models` with thousands of models and aliases, and what it costs `/health` beside it.

Each tree named (by default /work/main, the code before, and this checkout) runs in its own
process: the gateway's aiohttp application over a table of MODELS running deployments (no
sleep mode, so nothing is asked of an engine) and ALIASES aliases (all of them patterns like
`claude-*` unless --pattern-every says otherwise). A client asks /v1/models ROUNDS times
while another asks /health every 10 ms; the listing's time and the worst /health wait (the
event loop is blocked while the listing is built) are printed per tree, then their ratios.

    python benchmarks/models_listing.py [--models 3000] [--aliases 3000] [--rounds 3]
        [--pattern-every 1] [--tree /work/main] [--tree .]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import asyncio, json, sys, time
import aiohttp
import sm120
assert sm120.__file__.startswith(sys.argv[5]), (sm120.__file__, sys.argv[5])
from aiohttp.test_utils import TestClient, TestServer
from sm120.gateway.aliases import Alias
from sm120.gateway.backends import Backend
from sm120.gateway.proxy import build_app
from sm120.gateway.swap import SwapPolicy, Swapper

MODELS, ALIASES, ROUNDS, EVERY = (int(v) for v in sys.argv[1:5])
KEY = "bench-key"
table = {
    f"model-{i}": Backend(model=f"model-{i}", deployment=f"dep-{i}",
                          base_url="http://127.0.0.1:9", api_key=None, running=True,
                          startable=True, sleep_mode=False)
    for i in range(MODELS)
}
aliases = tuple(
    Alias(f"client-{i}-*" if i % EVERY == 0 else f"client-{i}", f"dep-{i % MODELS}")
    for i in range(ALIASES)
)

async def discover():
    return dict(table)

async def main():
    async with aiohttp.ClientSession() as upstream:
        swapper = Swapper(SwapPolicy(), None, discover)
        app = build_app(KEY, swapper, upstream, aliases)
        async with TestClient(TestServer(app)) as client:
            headers = {"Authorization": f"Bearer {KEY}"}
            listing, worst_health = [], 0.0
            stop = asyncio.Event()

            async def health():
                nonlocal worst_health
                while not stop.is_set():
                    started = time.perf_counter()
                    async with client.get("/health") as answer:
                        await answer.read()
                    worst_health = max(worst_health, time.perf_counter() - started)
                    await asyncio.sleep(0.01)

            prober = asyncio.ensure_future(health())
            await asyncio.sleep(0.05)
            for _ in range(ROUNDS):
                started = time.perf_counter()
                async with client.get("/v1/models", headers=headers) as answer:
                    body = await answer.json()
                listing.append(time.perf_counter() - started)
                assert len(body["data"]) == MODELS + ALIASES, len(body["data"])
            stop.set()
            await prober
    print(json.dumps({"first_s": listing[0], "listing_s": min(listing),
                      "worst_health_s": worst_health}))

asyncio.run(main())
"""


def run(tree: Path, models: int, aliases: int, rounds: int, every: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(models),
            str(aliases),
            str(rounds),
            str(every),
            str(tree.resolve()),
        ],
        env=env,
        cwd=tree,  # `python -c` puts the working folder first on sys.path
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr.strip().splitlines()[-1]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=3000)
    parser.add_argument("--aliases", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--pattern-every", type=int, default=1, help="every Nth alias is a pattern (1: all)"
    )
    parser.add_argument("--tree", type=Path, action="append")
    args = parser.parse_args()
    trees = args.tree or [Path("/work/main"), REPO]
    results = {
        tree: run(tree, args.models, args.aliases, args.rounds, args.pattern_every)
        for tree in trees
    }
    print(
        f"{args.models:,} models, {args.aliases:,} aliases (every {args.pattern_every}. a "
        f"pattern), fastest of {args.rounds} rounds"
    )
    for tree, result in results.items():
        print(
            f"  {tree}: /v1/models first {result['first_s'] * 1000:,.1f} ms, fastest "
            f"{result['listing_s'] * 1000:,.1f} ms, "
            f"worst /health beside it {result['worst_health_s'] * 1000:,.1f} ms"
        )
    if len(trees) == 2:
        before, after = (results[tree] for tree in trees)
        print(
            "  ratio (first tree / second): /v1/models first "
            f"{before['first_s'] / after['first_s']:.1f}x, "
            f"fastest {before['listing_s'] / after['listing_s']:.1f}x, "
            f"worst /health {before['worst_health_s'] / after['worst_health_s']:.1f}x"
        )


if __name__ == "__main__":
    main()
