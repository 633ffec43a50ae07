"""Request-level A/B, run by the ENGINE's Python (it needs vLLM and aiohttp): vLLM's own
request function (the one `vllm bench serve` drives) against sm120's, alternating request by
request on prompts of the same shape, in one event loop with one connection each.

Usage (benchmarks/bench_vs_vllm.py runs it): ENGINE_PYTHON request_ab.py URL MODEL N LEN OUT
with OPENAI_API_KEY in the environment and the repository root on PYTHONPATH.
Prints one JSON line: per side, the TTFTs, decode rates and whether each stream was bursty.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from typing import Any

import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import (  # type: ignore[import-not-found]
    RequestFuncInput,
    async_request_openai_completions,
)

from sm120.measure.load import COMPLETIONS_PATH, _one


def _vllm_bursty(ttft: float, latency: float, tokens: int) -> bool:
    # the same test as sm120's: the tokens after the first came in under a tenth of the time
    return tokens >= 8 and (latency - ttft) < latency / 10


async def main(url: str, model: str, pairs: int, length: int, out: int) -> dict[str, Any]:
    key = os.environ.get("OPENAI_API_KEY", "")
    rng = random.Random(int(time.time()))
    results: dict[str, list[dict[str, Any]]] = {"vllm": [], "sm120": []}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as session,
        aiohttp.ClientSession(headers=headers) as ours,
    ):
        for number in range(pairs):
            order = ("vllm", "sm120") if number % 2 == 0 else ("sm120", "vllm")
            for side in order:
                prompt = [rng.randint(30, 500) for _ in range(length)]
                if side == "vllm":
                    request = RequestFuncInput(
                        prompt=prompt,
                        api_url=url + COMPLETIONS_PATH,
                        prompt_len=length,
                        output_len=out,
                        model=model,
                        ignore_eos=True,
                        extra_body={"temperature": 0},
                    )
                    output = await async_request_openai_completions(request, session)
                    span = output.latency - output.ttft
                    decode = (out - 1) / span if span > 0 else None
                    results[side].append(
                        {
                            "ttft": output.ttft,
                            "decode": decode,
                            "bursty": _vllm_bursty(output.ttft, output.latency, out),
                        }
                    )
                else:
                    timing = await _one(ours, url + COMPLETIONS_PATH, model, prompt, out)
                    found = {"ttft": timing.ttft_s, "decode": timing.decode_tps}
                    results[side].append({**found, "bursty": timing.bursty})
    return results


if __name__ == "__main__":
    url, model, pairs, length, out = sys.argv[1:6]
    found = asyncio.run(main(url, model, int(pairs), int(length), int(out)))
    print(json.dumps(found))
