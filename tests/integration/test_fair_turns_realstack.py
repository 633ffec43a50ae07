"""First token first against a real tiny vLLM CPU engine through the real gateway: vLLM's
first streamed event comes with the first token, so a heavier key's new request waits for a
lighter key's first token, not for its whole answer nor for the hold's bound."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import free_port
from tests.integration.realstack import sm120

pytestmark = pytest.mark.integration

SLOTS = 8  # max-num-seqs: key "a" may hold 4 beside a busy "b"; its 3 are past the floor (1)
HOLD_S = 30.0  # far past any first token here: a hold that ends at its bound fails the test


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("home")
    port, gateway_port = free_port(), free_port()
    launched = sm120(
        home, "launch", "tiny", "--port", str(port), "--model-dir", str(tiny_model),
        "--no-monitor", "--set", f"max-num-seqs={SLOTS}",
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-3000:]
    keys = {name: sm120(home, "gateway", "keys", "add", name).stdout.strip() for name in "ab"}
    started = sm120(
        home, "gateway", "start", "--port", str(gateway_port), "--first-token-hold", str(HOLD_S)
    )
    assert started.returncode == 0, started.stderr
    admin = (home / "gateway" / "api_key").read_text().strip()
    yield {"url": f"http://127.0.0.1:{gateway_port}", "keys": keys, "admin": admin}
    sm120(home, "gateway", "stop")
    sm120(home, "stop")


async def stream(
    session: aiohttp.ClientSession, url: str, key: str, content: str, max_tokens: int,
    times: dict[str, float], name: str,
) -> None:  # fmt: skip
    body = {
        "model": "tiny", "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as answer:
        assert answer.status == 200, await answer.text()
        async for line in answer.content:
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"]:
                times.setdefault(f"{name} first", time.monotonic())
    times[f"{name} end"] = time.monotonic()


def test_a_heavier_keys_new_request_waits_for_the_lighter_keys_first_token(
    stack: dict[str, Any],
) -> None:
    url, keys = stack["url"], stack["keys"]

    async def scenario() -> tuple[dict[str, float], str]:
        times: dict[str, float] = {}
        async with aiohttp.ClientSession() as session:
            flood = [
                asyncio.ensure_future(
                    stream(session, url, keys["a"], f"flood {n}", 400, times, f"a{n}")
                )
                for n in range(3)
            ]
            while len([k for k in times if k.endswith("first")]) < 3:
                await asyncio.sleep(0.02)
            # b's longer prompt takes a while to prefill; a's next request arrives meanwhile.
            prompt = "Summarise these notes. " + " ".join(
                f"note {n}: keep I/O apart." for n in range(30)
            )
            b = asyncio.ensure_future(stream(session, url, keys["b"], prompt, 48, times, "b"))
            await asyncio.sleep(0.005)
            fifth = asyncio.ensure_future(
                stream(session, url, keys["a"], "one more", 4, times, "a-next")
            )
            await asyncio.gather(b, fifth)
            headers = {"Authorization": f"Bearer {stack['admin']}"}
            async with session.get(f"{url}/metrics", headers=headers) as answer:
                metrics = await answer.text()
            for task in flood:
                task.cancel()
        return times, metrics

    times, metrics = asyncio.run(scenario())
    assert 'sm120_gateway_turn_waits_total{key="a"} 1' in metrics
    assert times["b first"] <= times["a-next first"] < times["b end"]
    assert times["a-next first"] - times["b first"] < HOLD_S / 2
