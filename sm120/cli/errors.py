"""Map errors to one line on stderr, in one place: what the user can fix (an SM120Error, a
file the system refuses, bytes that are not text) exits 2; anything else is a bug in sm120
and says so (exit 70), rather than passing for a mistake in the input."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import typer

from sm120.cli.bounds import check_options, numeric_options
from sm120.core.errors import SM120Error
from sm120.core.terminal import terminal_safe

F = TypeVar("F", bound=Callable[..., Any])


# Exit statuses: 2 for what the user can fix (a value, a file, a server); 70 (sysexits'
# EX_SOFTWARE) for a bug in sm120 itself, so a script can tell the two apart.
USER_ERROR = 2
INTERNAL_ERROR = 70
INTERRUPTED = 130
REPORT_HINT = (
    "this is a bug in sm120, not in what you gave it; please report it with the output of "
    "the same command under SM120_DEBUG=1 (it shows where it failed)"
)


def report(exc: SM120Error) -> None:
    # Server text can reach a message; its escape sequences must not reach the terminal.
    sys.stderr.write(f"Error: {terminal_safe(exc.one_line())}\n")


def _detail(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or "no detail"


def report_os_error(exc: OSError) -> None:
    """The file system or the kernel refused (a permission, an immutable file, a name too
    long, a full disk): the user's to fix, in one line naming the file."""
    what = exc.strerror or _detail(exc)
    names = [str(name) for name in (exc.filename, exc.filename2) if name is not None]
    shown = [
        name if len(name) <= 120 else f"{name[:100]}... ({len(name):,} characters)"
        for name in names
    ]
    where = f": {' -> '.join(shown)}" if shown else ""
    report(SM120Error(f"{what}{where}", "check the path, its permissions and the free space"))


def report_not_text(exc: UnicodeError) -> None:
    report(
        SM120Error(
            f"input that is not UTF-8 text ({_detail(exc)})",
            "give a UTF-8 text file (a key, a recipe, a prompt)",
        )
    )


def report_internal(exc: BaseException) -> None:
    """Anything else is a bug where it was raised: said as one, never as a user's mistake."""
    report(SM120Error(f"internal error ({type(exc).__name__}: {_detail(exc)})", REPORT_HINT))


def cli_errors(func: F) -> F:
    """Turn SM120Error into the one-line message; full tracebacks only with SM120_DEBUG=1.
    Numeric options are checked against their range (sm120.cli.bounds) first."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            # Looked up when the command runs, not when it is defined: `sm120 --help` skips it.
            check_options(func.__name__, numeric_options(func), kwargs)
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.ClickException):
            raise  # the CLI's own ways out
        except KeyboardInterrupt:
            # Ctrl-C before anything started (a launch past that point handles its own).
            sys.stderr.write("interrupted\n")
            raise typer.Exit(INTERRUPTED) from None
        except SM120Error as exc:
            if _debugging():
                raise
            report(exc)
            raise typer.Exit(USER_ERROR) from None
        except OSError as exc:
            if _debugging():
                raise
            report_os_error(exc)
            raise typer.Exit(USER_ERROR) from None
        except UnicodeError as exc:
            if _debugging():
                raise
            report_not_text(exc)
            raise typer.Exit(USER_ERROR) from None
        except Exception as exc:
            if _debugging():
                raise
            report_internal(exc)
            raise typer.Exit(INTERNAL_ERROR) from None

    return wrapper  # type: ignore[return-value]


def _debugging() -> bool:
    return os.environ.get("SM120_DEBUG") == "1"
