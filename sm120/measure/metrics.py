"""vLLM's Prometheus counters, read before and after a run, for what the run itself did.

Counters only grow, so the difference between two scrapes is what happened in between,
whatever other traffic the server saw before. Speculative decoding (MTP, EAGLE, n-gram)
publishes drafts, draft tokens and accepted tokens; their ratios are the acceptance figures
the seeds quote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_QUERIED_TOKENS = "vllm:prefix_cache_queries_total"
PREFIX_HIT_TOKENS = "vllm:prefix_cache_hits_total"


def parse_counters(text: str) -> dict[str, float]:
    """Sum every sample of each metric over its labels (engines, models, positions)."""
    totals: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        totals[name] = totals.get(name, 0.0) + value
    return totals


def difference(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """after - before for every counter present after; a restarted server resets to after."""
    delta: dict[str, float] = {}
    for name, value in after.items():
        previous = before.get(name, 0.0)
        delta[name] = value - previous if value >= previous else value
    return delta


@dataclass(frozen=True)
class SpecDecodeFigures:
    drafts: int
    draft_tokens: int
    accepted_tokens: int

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens per proposed draft token (0..1)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def acceptance_length(self) -> float | None:
        """Tokens gained per target-model step: the accepted drafts plus the one it makes."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_length": self.acceptance_length,
        }


def spec_decode(delta: Mapping[str, float]) -> SpecDecodeFigures | None:
    """None when the server does not speculate (no counters) or made no drafts in the run."""
    if SPEC_DRAFTS not in delta and SPEC_DRAFT_TOKENS not in delta:
        return None
    figures = SpecDecodeFigures(
        drafts=int(delta.get(SPEC_DRAFTS, 0.0)),
        draft_tokens=int(delta.get(SPEC_DRAFT_TOKENS, 0.0)),
        accepted_tokens=int(delta.get(SPEC_ACCEPTED, 0.0)),
    )
    return figures if figures.drafts or figures.draft_tokens else None


@dataclass(frozen=True)
class PrefixCacheFigures:
    """Prompt tokens the prefix cache was asked for and served, in one run."""

    queried_tokens: int
    hit_tokens: int

    def as_dict(self) -> dict[str, int]:
        return {"queried_tokens": self.queried_tokens, "hit_tokens": self.hit_tokens}


def prefix_cache(delta: Mapping[str, float]) -> PrefixCacheFigures | None:
    """None when the server does not count prefix-cache queries."""
    if PREFIX_QUERIED_TOKENS not in delta:
        return None
    return PrefixCacheFigures(
        queried_tokens=int(delta.get(PREFIX_QUERIED_TOKENS, 0.0)),
        hit_tokens=int(delta.get(PREFIX_HIT_TOKENS, 0.0)),
    )
