"""The gateway's own Prometheus counters, labelled by key name: requests by model and status,
tokens by kind, refusals by reason, and usage records dropped. Served at the gateway's
/metrics (the admin key), in the text format Prometheus scrapes."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sm120.gateway.usage import Record


def _label(value: str) -> str:
    # The exposition format's escapes: a key name or a model is the client's text.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Meter:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str, str]] = Counter()
        self.token_counts: Counter[tuple[str, str]] = Counter()
        self.refusals: Counter[tuple[str, str]] = Counter()
        # Requests that waited for their turn on a deployment, and how long in all.
        self.turn_waits: Counter[str] = Counter()
        self.turn_wait_s: defaultdict[str, float] = defaultdict(float)
        # Read when rendered: the usage writer's own count of what it could not keep.
        self.dropped: Callable[[], int] = lambda: 0

    def answered(self, key: str, model: str, status: int) -> None:
        self.requests[(key, model, str(status))] += 1

    def refused(self, key: str, reason: str) -> None:
        self.refusals[(key, reason)] += 1

    def waited(self, key: str, seconds: float) -> None:
        self.turn_waits[key] += 1
        self.turn_wait_s[key] += seconds

    def tokens(self, record: Record) -> None:
        for kind, value in (
            ("prompt", record.prompt_tokens), ("cached", record.cached_tokens),
            ("completion", record.completion_tokens),
        ):  # fmt: skip
            if value:
                self.token_counts[(record.key, kind)] += value

    def render(self) -> str:
        lines = [
            "# HELP sm120_gateway_requests_total Requests answered, by key, model and status.",
            "# TYPE sm120_gateway_requests_total counter",
        ]
        for (key, model, status), n in sorted(self.requests.items()):
            lines.append(
                f'sm120_gateway_requests_total{{key="{_label(key)}",model="{_label(model)}",'
                f'status="{status}"}} {n}'
            )
        lines += [
            "# HELP sm120_gateway_tokens_total Tokens by key and kind (the engine's usage).",
            "# TYPE sm120_gateway_tokens_total counter",
        ]
        for (key, kind), n in sorted(self.token_counts.items()):
            lines.append(f'sm120_gateway_tokens_total{{key="{_label(key)}",kind="{kind}"}} {n}')
        lines += [
            "# HELP sm120_gateway_refused_total Requests refused, by key and reason.",
            "# TYPE sm120_gateway_refused_total counter",
        ]
        for (key, reason), n in sorted(self.refusals.items()):
            lines.append(
                f'sm120_gateway_refused_total{{key="{_label(key)}",reason="{reason}"}} {n}'
            )
        lines += [
            "# HELP sm120_gateway_turn_waits_total Requests that waited for a turn, by key.",
            "# TYPE sm120_gateway_turn_waits_total counter",
        ]
        for key, n in sorted(self.turn_waits.items()):
            lines.append(f'sm120_gateway_turn_waits_total{{key="{_label(key)}"}} {n}')
        lines += [
            "# HELP sm120_gateway_turn_wait_seconds_total Seconds requests waited for turns.",
            "# TYPE sm120_gateway_turn_wait_seconds_total counter",
        ]
        for key, seconds in sorted(self.turn_wait_s.items()):
            lines.append(
                f'sm120_gateway_turn_wait_seconds_total{{key="{_label(key)}"}} {seconds:.6f}'
            )
        lines += [
            "# HELP sm120_gateway_usage_dropped_total Usage records dropped (disk, lock, queue).",
            "# TYPE sm120_gateway_usage_dropped_total counter",
            f"sm120_gateway_usage_dropped_total {self.dropped()}",
        ]
        return "\n".join(lines) + "\n"
