"""The restart policy a deployment is launched with: `--restart`, the recipe's
`monitor.restart` and `.env`'s RESTART all take the same words.

    no             a server that dies stays dead (the default)
    on-failure     the monitor relaunches a server that dies of a failure, up to the recipe's
                   monitor.max_restarts per window (the watchdog's circuit breaker)
    on-failure:N   the same, at most N restarts per window

As with systemd's Restart=on-failure, an engine that exits 0 or ends by SIGTERM, SIGINT or
SIGHUP (someone asked it to stop) is not a failure; any other exit code or signal is.
Pure: no I/O, so the recipe schema, the plan and the monitor all read it the same way.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from sm120.core.errors import PlanError

RESTART_WORDS = ("no", "on-failure")
DEFAULT_RESTART = "no"
# The first wait before a relaunch that follows another restart (doubling after that).
DEFAULT_RESTART_BACKOFF_S = 10.0
# More relaunches than this in one window is a crash loop, not bad luck.
MAX_RESTART_LIMIT = 100
CLEAN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
RESTART_HINT = (
    "use no, on-failure, or on-failure:N for at most N restarts per window, N from 1 to 100"
)


class RestartPolicyError(PlanError):
    """A restart policy that is not one of the words above."""


@dataclass(frozen=True)
class RestartPolicy:
    on_failure: bool
    # None: the recipe's monitor.max_restarts.
    limit: int | None = None

    def __str__(self) -> str:
        if not self.on_failure:
            return "no"
        return "on-failure" if self.limit is None else f"on-failure:{self.limit}"


def parse_restart_policy(text: str) -> RestartPolicy:
    word, sep, count = text.strip().partition(":")
    if word not in RESTART_WORDS:
        raise RestartPolicyError(f"unknown restart policy '{text}'", RESTART_HINT)
    if word == "no":
        if sep:
            raise RestartPolicyError(f"restart policy '{text}' takes no count", RESTART_HINT)
        return RestartPolicy(on_failure=False)
    if not sep:
        return RestartPolicy(on_failure=True)
    try:
        limit = int(count)
    except ValueError:
        raise RestartPolicyError(
            f"'{count}' in restart policy '{text}' is not a number of restarts", RESTART_HINT
        ) from None
    if not 1 <= limit <= MAX_RESTART_LIMIT:
        raise RestartPolicyError(
            f"restart policy '{text}' allows {limit} restarts; it must be 1 to {MAX_RESTART_LIMIT}",
            "use --restart no to never relaunch, else on-failure:N with N from 1 to 100",
        )
    return RestartPolicy(on_failure=True, limit=limit)


def policy_text(value: object) -> str:
    """A policy as YAML or --set parsed it: a bare `no` arrives as false."""
    return "no" if value is False else str(value)


def is_failure(returncode: int | None, signum: int | None) -> bool:
    """Did the engine end of a failure (relaunch) rather than by request (leave it)? An end
    with no known status (the process vanished, the container was removed) is a failure."""
    if signum is not None:
        return signum not in CLEAN_SIGNALS
    return returncode != 0
