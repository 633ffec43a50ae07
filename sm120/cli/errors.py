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

F = TypeVar("F", bound=Callable[..., Any])


def report(exc: SM120Error) -> None:
    sys.stderr.write(f"Error: {exc.one_line()}\n")


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

    return wrapper  # type: ignore[return-value]
