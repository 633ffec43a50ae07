"""Map errors to one line on stderr and exit code 2, in one place."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from sm120.cli.bounds import check_options, numeric_options
from sm120.core.errors import SM120Error
from sm120.core.terminal import terminal_safe

F = TypeVar("F", bound=Callable[..., Any])


# What input sm120 failed to foresee raises: numbers past a float, nesting past the stack,
# bytes that are not text, a folder or file where the other was expected. Each is a bug to
# fix where the input is read; until then the user gets one line, not a traceback.
UNFORESEEN = (
    ArithmeticError,
    RecursionError,
    ValueError,
    TypeError,
    IsADirectoryError,
    FileExistsError,
    NotADirectoryError,
)


def report(exc: SM120Error) -> None:
    # Server text can reach a message; its escape sequences must not reach the terminal.
    sys.stderr.write(f"Error: {terminal_safe(exc.one_line())}\n")


def report_unforeseen(exc: BaseException) -> None:
    detail = " ".join(str(exc).split())[:200] or "no detail"
    report(
        SM120Error(
            f"sm120 could not handle this input ({type(exc).__name__}: {detail})",
            "check the values given; SM120_DEBUG=1 shows where it failed (please report it)",
        )
    )


def cli_errors(func: F) -> F:
    """Turn SM120Error into the one-line message; full tracebacks only with SM120_DEBUG=1.
    Numeric options are checked against their range (sm120.cli.bounds) first."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            # Looked up when the command runs, not when it is defined: `sm120 --help` skips it.
            check_options(func.__name__, numeric_options(func), kwargs)
            return func(*args, **kwargs)
        except SM120Error as exc:
            if os.environ.get("SM120_DEBUG") == "1":
                raise
            report(exc)
            raise typer.Exit(2) from None
        except UNFORESEEN as exc:
            if os.environ.get("SM120_DEBUG") == "1":
                raise
            report_unforeseen(exc)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
