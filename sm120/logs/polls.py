"""The monitor's own requests in the engine's access log.

The monitor asks `/health` and `/metrics` every few seconds, and the engine logs each one
(uvicorn's access log: `INFO:     127.0.0.1:55704 - "GET /health HTTP/1.1" 200 OK`); on an
idle server they are most of the log. `sm120 logs` hides them unless asked.
"""

from __future__ import annotations

import re

_POLL = re.compile(r'"GET /(?:health|metrics)(?:\?[^ "]*)? HTTP/[0-9.]+" \d{3}')


def is_poll_line(line: str) -> bool:
    """An access-log line of a GET /health or /metrics (whoever sent it)."""
    return _POLL.search(line) is not None


def without_polls(lines: list[str]) -> list[str]:
    return [line for line in lines if not is_poll_line(line)]
