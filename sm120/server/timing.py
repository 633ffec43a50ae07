"""How a streamed answer is timed, as `vllm bench serve` times it: one rule for the chat
client, the gates' wire and our load generator (sm120.measure.load), so their figures compare.
"""

from __future__ import annotations


def decode_rate(tokens: int | None, first: float | None, last: float | None) -> float | None:
    """Tokens after the first, per second after the first (`vllm bench serve`'s 1/TPOT);
    None where that cannot be measured: fewer than two tokens, or no time between them.
    Each caller says which moment ends the stream for it."""
    if tokens is None or tokens < 2 or first is None or last is None or last <= first:
        return None
    return (tokens - 1) / (last - first)
