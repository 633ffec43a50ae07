"""Typed events read from engine log lines (see sm120/logs/logparse.py).

Each event has a stable `kind` and fields that are None when the log line did not say;
`as_dict()` drops those, which is the JSON contract of `sm120 logs parse --json`. Events are
plain (not frozen) dataclasses on purpose: a busy log makes many, and frozen ones cost twice
as much to build.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar


@dataclass(slots=True)
class Event:
    kind: ClassVar[str] = "event"

    def as_dict(self) -> dict[str, Any]:
        """{"kind": ..., field: value, ...} in field order, fields that are None left out."""
        out: dict[str, Any] = {"kind": self.kind}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            out[field.name] = list(value) if isinstance(value, tuple) else value
        return out

    def describe(self) -> str:
        """One readable line (the non-JSON output of `sm120 logs parse`)."""
        parts = [
            _format(field.name, getattr(self, field.name))
            for field in fields(self)
            if getattr(self, field.name) is not None
        ]
        return f"{self.kind:<16} {', '.join(parts)}".rstrip()


@dataclass(slots=True)
class Stats(Event):
    """The periodic scheduler line ("Avg prompt throughput: ...")."""

    kind: ClassVar[str] = "stats"
    engine: int | None = None  # "Engine 001:" (V1); absent on V0 lines
    engines: int | None = None  # "2 Engines Aggregated:"
    prompt_tps: float | None = None
    gen_tps: float | None = None
    running: int | None = None
    waiting: int | None = None  # "Waiting" (V1) or "Pending" (V0)
    swapped: int | None = None  # V0 only
    preemptions: int | None = None  # logged only when > 0
    kv_usage_pct: float | None = None  # the engine's KV pool ("GPU"/"CPU KV cache usage")
    cpu_kv_usage_pct: float | None = None  # V0's CPU swap space, next to the GPU pool
    prefix_hit_pct: float | None = None


@dataclass(slots=True)
class SpecDecode(Event):
    """Speculative-decoding acceptance ("SpecDecoding metrics:" / V0 "Speculative metrics:")."""

    kind: ClassVar[str] = "spec_decode"
    mean_acceptance_length: float | None = None
    acceptance_rate_pct: float | None = None
    accepted_tokens: int | None = None
    drafted_tokens: int | None = None
    accepted_tps: float | None = None
    drafted_tps: float | None = None
    per_position_rates: tuple[float, ...] | None = None  # fractions, draft position 1..k


@dataclass(slots=True)
class KvCache(Event):
    """ "GPU KV cache size: 729,248 tokens" ("CPU" on CPU builds)."""

    kind: ClassVar[str] = "kv_cache"
    tokens: int
    device: str | None = None


@dataclass(slots=True)
class MaxConcurrency(Event):
    """ "Maximum concurrency for 250,000 tokens per request: 2.84x"."""

    kind: ClassVar[str] = "max_concurrency"
    tokens_per_request: int
    x: float


@dataclass(slots=True)
class KvMemory(Event):
    """ "Available KV cache memory: 31.99 GiB"."""

    kind: ClassVar[str] = "kv_memory"
    gib: float


@dataclass(slots=True)
class KvBlocks(Event):
    """ "# GPU blocks: N, # CPU blocks: M" (V0, and early V1 with only the GPU part)."""

    kind: ClassVar[str] = "kv_blocks"
    gpu_blocks: int
    cpu_blocks: int | None = None


@dataclass(slots=True)
class ModelLoaded(Event):
    """ "Model loading took 47.11 GiB memory and 14.96 seconds" (V0: "... took 14.99 GB")."""

    kind: ClassVar[str] = "model_loaded"
    gib: float
    seconds: float | None = None


@dataclass(slots=True)
class CudaGraphs(Event):
    """ "Graph capturing finished in 14 secs, took 0.84 GiB"."""

    kind: ClassVar[str] = "cuda_graphs"
    seconds: float
    gib: float | None = None


@dataclass(slots=True)
class EngineInit(Event):
    """ "init engine (profile, create kv cache, warmup model) took 44.51 seconds"."""

    kind: ClassVar[str] = "engine_init"
    seconds: float
    compile_seconds: float | None = None


@dataclass(slots=True)
class PrefixCache(Event):
    """V0's separate "Prefix cache hit rate: GPU: 22.16%, CPU: 0.00%" line."""

    kind: ClassVar[str] = "prefix_cache"
    prefix_hit_pct: float
    cpu_prefix_hit_pct: float | None = None


@dataclass(slots=True)
class Ready(Event):
    """The API server finished starting ("Application startup complete.")."""

    kind: ClassVar[str] = "ready"


@dataclass(slots=True)
class IndexTopkSkip(Event):
    """One "skip sparse MLA indexer computation on layer N" boot line (F09 counts them)."""

    kind: ClassVar[str] = "index_topk_skip"
    layer: int
    count: int  # skip lines seen so far by this parser, this one included


@dataclass(slots=True)
class Failure(Event):
    """A line matching a signature of the failure catalogue (sm120/data/failures.yaml)."""

    kind: ClassVar[str] = "failure"
    id: str
    line: str

    def describe(self) -> str:
        return f"{self.kind:<16} {self.id}: {self.line}"


_LABELS = {
    "prompt_tps": "prompt",
    "gen_tps": "gen",
    "kv_usage_pct": "KV",
    "cpu_kv_usage_pct": "CPU KV",
    "prefix_hit_pct": "prefix hit",
    "cpu_prefix_hit_pct": "CPU prefix hit",
    "acceptance_rate_pct": "acceptance",
    "accepted_tps": "accepted",
    "drafted_tps": "drafted",
    "per_position_rates": "per position",
    "compile_seconds": "compiling",
    "tokens_per_request": "tokens per request",
}


def _format(name: str, value: Any) -> str:
    label = _LABELS.get(name, name.replace("_", " "))
    if isinstance(value, tuple):
        return f"{label} {'/'.join(f'{item:g}' for item in value)}"
    if name.endswith("_pct"):
        return f"{label} {value}%"
    if name.endswith("_tps"):
        return f"{label} {value} tok/s"
    if name == "gib":
        return f"{value} GiB"
    if name.endswith("seconds"):
        return f"{label} {value} s" if name != "seconds" else f"{value} s"
    if name == "x":
        return f"{value}x"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000:
        return f"{label} {value:,}"
    return f"{label} {value}"
