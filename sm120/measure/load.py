"""Our own load generator: streamed /v1/completions requests at exact prompt lengths.

Prompts come from measure/prompts.py, text of the exact length (this client takes token ids
too), and no two share a prefix: the prefix cache would otherwise turn a prefill measurement
into a cache-hit measurement. `TokenPool` is where its fallback prompts come from: ids drawn
one by one from those the server's own tokenizer produced. Timing follows `vllm bench serve`:
TTFT is the first streamed chunk that carries a token, decode rate is (tokens - 1) over the
time from that chunk to the last one.

The transport is aiohttp, the client `vllm bench serve` itself uses: measured side by side on a
256-token prompt, httpx's streaming added 1.5-2.5 ms to every TTFT (13-15% there), aiohttp
none beyond vLLM's own request function (benchmarks/request_ab.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from sm120.measure.text import filler
from sm120.server.timing import decode_rate
from sm120.server.transport import MAX_EVENT_BYTES, server_root

COMPLETIONS_PATH = "/v1/completions"

Prompt = list[int] | str


@dataclass
class RequestTiming:
    prompt_tokens: int | None
    started: float
    completion_tokens: int | None = None
    first_at: float | None = None
    last_at: float | None = None
    ended: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_at is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_at is None else self.first_at - self.started

    @property
    def decode_tps(self) -> float | None:
        """(tokens - 1) / (last token - first token): `vllm bench serve`'s 1/TPOT.

        Every completions chunk with a choice is a decode step (the text may be empty), so
        the last one marks the last token; the usage chunk and [DONE] come after it.
        """
        return decode_rate(self.completion_tokens, self.first_at, self.last_at)

    @property
    def bursty(self) -> bool:
        if self.first_at is None or self.last_at is None:
            return False
        return arrived_in_burst(
            self.completion_tokens, self.first_at - self.started, self.last_at - self.first_at
        )

    @property
    def prefill_tps(self) -> float | None:
        ttft = self.ttft_s
        return self.prompt_tokens / ttft if self.prompt_tokens and ttft else None


def arrived_in_burst(tokens: int | None, ttft_s: float, decode_span_s: float) -> bool:
    """The tokens after the first arrived in under a tenth of the request's time: the server
    (often its API process, starved of CPU) held them back and let them go at once, so the
    decode rate says little. Meant for decode runs (short prompts, many tokens), where
    generating takes most of the time. One rule for both tools, so their figures compare."""
    if (tokens or 0) < 8:
        return False
    return decode_span_s < (ttft_s + decode_span_s) / 10


@dataclass
class LoadResult:
    concurrency: int
    duration_s: float
    requests: list[RequestTiming] = field(default_factory=list)

    @property
    def completed(self) -> list[RequestTiming]:
        return [r for r in self.requests if r.ok]

    @property
    def failed(self) -> int:
        return len(self.requests) - len(self.completed)

    @property
    def output_tokens(self) -> int:
        return sum(r.completion_tokens or 0 for r in self.completed)

    @property
    def aggregate_tps(self) -> float | None:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else None

    @property
    def per_request_tps(self) -> float | None:
        """1 / mean time per output token: vLLM's mean TPOT, inverted, for comparison."""
        return _inverse_mean([r.decode_tps for r in self.completed])

    @property
    def smooth_decode_tps(self) -> float | None:
        """The same over the requests that did not arrive in bursts; None if all did."""
        return _inverse_mean([r.decode_tps for r in self.completed if not r.bursty])

    @property
    def ttfts(self) -> list[float]:
        return [r.ttft_s for r in self.completed if r.ttft_s is not None]

    @property
    def mean_ttft_s(self) -> float | None:
        return statistics.fmean(self.ttfts) if self.ttfts else None

    @property
    def median_ttft_s(self) -> float | None:
        """Robust where the mean is not: one stalled first token (a CPU-starved server holds
        a whole stream back) moves the mean of a few requests by a factor, not the median."""
        return statistics.median(self.ttfts) if self.ttfts else None

    @property
    def prefill_tps(self) -> float | None:
        """Mean prompt length over mean TTFT: how `vllm bench serve` figures are read too."""
        timed = [r for r in self.completed if r.prompt_tokens and r.ttft_s]
        if not timed:
            return None
        tokens = statistics.fmean(r.prompt_tokens or 0 for r in timed)
        return tokens / statistics.fmean(r.ttft_s or 0.0 for r in timed)

    @property
    def bursty(self) -> int:
        return sum(1 for r in self.completed if r.bursty)

    @property
    def first_error(self) -> str | None:
        return next((r.error for r in self.requests if r.error), None)


def _inverse_mean(rates: Sequence[float | None]) -> float | None:
    usable = [rate for rate in rates if rate]
    return 1.0 / statistics.fmean(1.0 / rate for rate in usable) if usable else None


class TokenPool:
    """Ids the server's tokenizer produced from ordinary text: always valid for the model."""

    def __init__(self, ids: Sequence[int], seed: int = 0) -> None:
        unique = sorted(set(ids))
        if len(unique) < 8:
            raise ValueError("the token pool needs at least 8 distinct ids")
        self._ids = unique
        self._rng = random.Random(seed)

    def prompt(self, length: int) -> list[int]:
        return [self._rng.choice(self._ids) for _ in range(length)]

    def prompts(self, length: int, count: int) -> list[Prompt]:
        return [self.prompt(length) for _ in range(count)]


def text_prompts(length: int, count: int, seed: int = 0) -> list[Prompt]:
    """For servers without /tokenize: text of roughly `length` tokens (usage tells the truth)."""

    sentences = filler(seed, count * max(1, length // 14) + count)
    per = max(1, length // 14)
    return [" ".join(sentences[i * per : (i + 1) * per]) for i in range(count)]


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    prompt: Prompt,
    max_tokens: int,
) -> RequestTiming:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        # Generate the full length whatever the model "wants": a throughput probe, not a chat.
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    timing = RequestTiming(
        prompt_tokens=len(prompt) if isinstance(prompt, list) else None,
        started=time.perf_counter(),
    )
    events = _EventSplitter()
    try:
        async with session.post(url, json=body) as response:
            if response.status >= 400:
                # The start of the body says why; the rest is not read.
                text = (await response.content.read(1 << 16)).decode(errors="replace")
                timing.error = f"HTTP {response.status}: {text[:160]}"
                return timing
            async for data in response.content.iter_any():
                arrived = time.perf_counter()
                if any(_take_event(event, timing, arrived) for event in events.feed(data)):
                    break
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        timing.error = f"{type(exc).__name__}: {exc}"[:200]
    except EventTooLong as exc:
        timing.error = str(exc)
    timing.ended = time.perf_counter()
    return timing


class EventTooLong(Exception):
    """The server streamed an event past MAX_EVENT_BYTES: not an engine's stream."""


class _EventSplitter:
    """Raw bytes in, SSE data payloads out. The client stays cheap on purpose: on a busy
    machine every millisecond of client CPU shows up in the timings it reports."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._pending += data
        *complete, self._pending = self._pending.replace(b"\r\n", b"\n").split(b"\n\n")
        if len(self._pending) > MAX_EVENT_BYTES:
            raise EventTooLong(f"the stream sent an event longer than {MAX_EVENT_BYTES >> 20} MiB")
        payloads = []
        for event in complete:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    payloads.append(line[5:].strip())
        return payloads


_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')


def _take_event(payload: bytes, timing: RequestTiming, arrived: float) -> bool:
    """Handle one SSE data payload; True at [DONE] or an error."""
    if payload == b"[DONE]":
        return True
    if b'"choices"' in payload and not _EMPTY_CHOICES.search(payload) and b'"error"' not in payload:
        # A decode step: no need to parse it. Every chunk with a choice counts, even with
        # empty text (a partial UTF-8 byte); counting only text would stretch TTFT.
        if timing.first_at is None:
            timing.first_at = arrived
        timing.last_at = arrived
        return False
    try:
        chunk = json.loads(payload)
    except (json.JSONDecodeError, RecursionError):
        timing.error = f"a stream line that is not JSON: {payload[:80]!r}"
        return True
    if not isinstance(chunk, dict):
        return False
    if "error" in chunk or chunk.get("object") == "error":
        timing.error = f"error mid-stream: {str(chunk.get('error') or chunk)[:160]}"
        return True
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("completion_tokens"), int):
            timing.completion_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            timing.prompt_tokens = usage["prompt_tokens"]
    return False


async def _run(
    base_url: str,
    api_key: str | None,
    model: str,
    prompts: Sequence[Prompt],
    max_tokens: int,
    concurrency: int,
    timeout: float,
) -> LoadResult:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    root = server_root(base_url)
    url = root + COMPLETIONS_PATH
    queue: asyncio.Queue[Prompt] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    timings: list[RequestTiming] = []
    async with aiohttp.ClientSession(
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=10.0),
        connector=aiohttp.TCPConnector(limit=concurrency + 2),
    ) as session:

        async def worker() -> None:
            while not queue.empty():
                prompt = queue.get_nowait()
                timings.append(await _one(session, url, model, prompt, max_tokens))

        # Open the connection before the clock starts: a TTFT should not include a TCP
        # handshake and pool setup that a steady client pays once.
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with session.get(root + "/health") as response:
                await response.content.read(1 << 16)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
        duration = time.perf_counter() - started
    return LoadResult(concurrency=concurrency, duration_s=duration, requests=timings)


def run_load(
    base_url: str,
    api_key: str | None,
    model: str,
    prompts: Sequence[Prompt],
    *,
    max_tokens: int,
    concurrency: int = 1,
    timeout: float = 3600.0,
) -> LoadResult:
    """Send every prompt, `concurrency` at a time (a closed loop, like --max-concurrency)."""
    return asyncio.run(_run(base_url, api_key, model, prompts, max_tokens, concurrency, timeout))


Conversation = Sequence[tuple[Prompt, int]]
"""One session's requests in order: (prompt, tokens to generate) each."""


async def _run_sessions(
    base_url: str,
    api_key: str | None,
    model: str,
    sessions: Sequence[Conversation],
    concurrency: int,
    timeout: float,
) -> LoadResult:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    root = server_root(base_url)
    url = root + COMPLETIONS_PATH
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for session in sessions:
        queue.put_nowait(session)
    timings: list[RequestTiming] = []
    async with aiohttp.ClientSession(
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=10.0),
        connector=aiohttp.TCPConnector(limit=concurrency + 2),
    ) as client:

        async def worker() -> None:
            while not queue.empty():
                for prompt, max_tokens in queue.get_nowait():
                    timings.append(await _one(client, url, model, prompt, max_tokens))

        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with client.get(root + "/health") as response:
                await response.content.read(1 << 16)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
        duration = time.perf_counter() - started
    return LoadResult(concurrency=concurrency, duration_s=duration, requests=timings)


def run_sessions(
    base_url: str,
    api_key: str | None,
    model: str,
    sessions: Sequence[Conversation],
    *,
    concurrency: int = 1,
    timeout: float = 3600.0,
) -> LoadResult:
    """Play each session's requests in order, `concurrency` sessions at a time: the turns of
    one session follow each other as a client's do, so what they share stays in the prefix
    cache the way it would (`sm120 tune`'s workloads)."""
    return asyncio.run(_run_sessions(base_url, api_key, model, sessions, concurrency, timeout))
