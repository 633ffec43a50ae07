"""The range of every numeric command-line option, in one table.

`cli_errors` checks each int or float option of a command against this table before the
command runs, so NaN, infinities, 10**30 and negative values get one line and exit 2 instead
of a traceback, a hang or a silently odd plan. tests/test_bad_input.py walks the Typer app
and fails for any numeric option missing here: a new option cannot ship unbounded.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from typer.models import ArgumentInfo, OptionInfo

from sm120.core.errors import SM120Error

# The biggest machine sm120 plans for: a few nodes of 8 GPUs each.
MAX_GPUS = 64
MAX_TOKENS = 10_000_000
DAY_S = 86_400.0


@dataclass(frozen=True)
class Bound:
    low: float
    high: float
    hint: str
    open_low: bool = False
    """The low end itself is refused (a fraction that must be above 0)."""
    open_high: bool = False

    def admits(self, value: float) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        below = value < self.high if self.open_high else value <= self.high
        return above and below


_PORT = Bound(1, 65535, "use a port from 1 to 65535, e.g. 8000")
_MAX_TOKENS = Bound(1, MAX_TOKENS, "or leave it out")

# "COMMAND --flag" wins over "--flag" where one flag means different things (COMMAND is the
# name of the command's function, which cli_errors sees).
BOUNDS: dict[str, Bound] = {
    "--port": _PORT,
    "--gateway-port": _PORT,
    # `gateway keys add`: a key's limits (leave one out for none).
    "keys_add --rpm": Bound(1, 1_000_000, "requests per minute, e.g. --rpm 60"),
    "keys_add --tpm": Bound(1, 10_000_000_000, "tokens per minute, e.g. --tpm 200000"),
    "keys_add --concurrency": Bound(1, 100_000, "requests in flight, e.g. --concurrency 8"),
    "--gpus": Bound(1, MAX_GPUS, "e.g. --gpus 4"),
    # launch checks a plan against declared hardware: 0 GPUs is a CPU-only machine (tiny)
    "launch --gpus": Bound(0, MAX_GPUS, "0 for a CPU-only machine, e.g. --gpus 4"),
    "launch --timeout": Bound(1, 7 * DAY_S, "seconds to wait for READY, e.g. --timeout 3600"),
    "stop --timeout": Bound(0, DAY_S, "seconds before SIGKILL, e.g. --timeout 30"),
    "--gate-max-tokens": _MAX_TOKENS,
    "--max-tokens": _MAX_TOKENS,
    # sm120/measure/agent_session.py's STEPS: the agent session has ten turns
    "test --turns": Bound(1, 10, "the agent session has 10 turns, e.g. --turns 3"),
    "--max-model-len": Bound(1, 1 << 24, "e.g. 131072"),
    "--gpu-mem-gib": Bound(0, 4096, "an RTX PRO 6000 has 94.97 GiB", open_low=True),
    "--kv-memory-gib": Bound(
        0, 4096, "take it from the engine's 'Available KV cache memory' line", open_low=True
    ),
    "--decode-tokens": Bound(2, MAX_TOKENS, "e.g. --decode-tokens 8"),
    "--requests": Bound(2, 100_000, "e.g. --requests 8"),
    "--settle": Bound(0, 600, "e.g. --settle 2"),
    "--threshold": Bound(0, 1, "e.g. 0.10", open_low=True, open_high=True),
    "--temperature": Bound(0, 2, "e.g. 0"),
    "--limit": Bound(0, 1_000_000, "0 asks every problem"),
    "--fewshot": Bound(0, 100, "e.g. --fewshot 5"),
    "--concurrency": Bound(1, 4096, "e.g. 4"),
    "--lengths": Bound(1, 1 << 24, "prompt tokens, e.g. --lengths 1024,8192"),
    "--min-score": Bound(0, 1, "e.g. 0.94"),
    "--lines": Bound(0, 1_000_000, "e.g. -n 50"),
    "parse --max-mib": Bound(1, 1 << 20, "MiB of stdin, e.g. --max-mib 8192"),
    "parse --timeout": Bound(
        0, 365 * DAY_S, "seconds to follow, e.g. --timeout 600", open_low=True
    ),
    "--max-awake": Bound(0, 1024, "how many deployments fit at once; 0 never swaps"),
    "--swap-wait": Bound(1, DAY_S, "seconds a request waits for a swap, e.g. --swap-wait 600"),
    "--busy-share": Bound(
        0,
        1,
        "the part of an engine's slots one key may hold, e.g. --busy-share 0.5",
        open_low=True,
    ),
    "--first-token-hold": Bound(0, 30, "seconds, e.g. --first-token-hold 1 (0: off)"),
    "tune --budget": Bound(0, 7 * 24 * 60, "minutes, e.g. --budget 30", open_low=True),
    "tune --rounds": Bound(1, 100, "measurements per candidate, e.g. --rounds 3"),
    "tune --pairs": Bound(1, 100, "alternating default/leader pairs, e.g. --pairs 3"),
    "tune --timeout": Bound(1, 7 * DAY_S, "seconds to wait for each READY, e.g. --timeout 900"),
}


class OutOfRange(SM120Error):
    """A numeric option outside its range."""


def bound_for(command: str, flag: str) -> Bound | None:
    return BOUNDS.get(f"{command} {flag}") or BOUNDS.get(flag)


def _words(number: float) -> str:
    if not isinstance(number, float):
        return str(number)
    short = f"{number:g}"
    return short if float(short) == number else repr(number)


def check_number(flag: str, value: float, bound: Bound) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise OutOfRange(f"{flag} must be a finite number, got {value}", bound.hint)
    if bound.admits(value):
        return
    shown = _words(value)
    if len(shown) > 24:
        shown = f"{shown[:12]}... ({len(shown)} digits)"
    if value <= bound.low:
        need = (
            f"more than {_words(bound.low)}" if bound.open_low else f"{_words(bound.low)} or more"
        )
    else:
        need = (
            f"less than {_words(bound.high)}"
            if bound.open_high
            else f"{_words(bound.high)} or less"
        )
    raise OutOfRange(f"{flag} must be {need}, got {shown}", bound.hint)


def declared_options(func: Callable[..., Any]) -> Iterator[tuple[str, tuple[str, ...], object]]:
    """(parameter name, its flags, its type) for each Typer option or argument of a command,
    declared either way: `x: int = typer.Option(None, "--x")` or `x: PortOpt = None` (an
    Annotated alias from sm120.cli.options, where Typer reads the first flag from the place
    of the default)."""
    hints = typing.get_type_hints(func, include_extras=True)
    for name, param in inspect.signature(func).parameters.items():
        kind, info = hints.get(name), param.default
        if isinstance(info, OptionInfo | ArgumentInfo):
            yield name, tuple(info.param_decls or ()), kind
        elif typing.get_origin(kind) is Annotated:
            kind, *extras = typing.get_args(kind)
            for extra in extras:
                if isinstance(extra, OptionInfo | ArgumentInfo):
                    first = (extra.default,) if isinstance(extra.default, str) else ()
                    yield name, (*first, *(extra.param_decls or ())), kind


@functools.cache
def numeric_options(func: Callable[..., Any]) -> dict[str, str]:
    """Parameter name -> flag, for the int and float options and arguments of a command."""
    found = {}
    for name, decls, kind in declared_options(func):
        if _is_number(kind):
            flags = [d for d in decls if d.startswith("--")]
            found[name] = flags[0] if flags else name
    return found


def _is_number(kind: object) -> bool:
    """int or float, optional or not (bool is neither here)."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        members = [k for k in typing.get_args(kind) if k is not type(None)]
        return len(members) == 1 and _is_number(members[0])
    return kind in (int, float)


def check_options(command: str, flags: dict[str, str], values: dict[str, Any]) -> None:
    for name, flag in flags.items():
        value = values.get(name)
        bound = bound_for(command, flag)
        if bound is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        check_number(flag, value, bound)
