"""Ctrl-C at the start of a command: while sm120 still imports it ends quietly (exit 130,
one line, no traceback from inside an import); later, before anything started, cli_errors
says "interrupted"; imported as a library, sm120 leaves SIGINT alone."""

from __future__ import annotations

import signal
import sys
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from sm120.cli.app import app
from sm120.core import startup


def test_imported_as_a_library_sm120_leaves_sigint_alone() -> None:
    assert signal.getsignal(signal.SIGINT) is not startup.interrupted_while_starting


def test_as_the_program_an_interrupt_while_importing_is_quiet_until_main(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    previous = signal.getsignal(signal.SIGINT)
    monkeypatch.setitem(
        sys.modules, "__main__", SimpleNamespace(__spec__=SimpleNamespace(name="sm120.__main__"))
    )
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        startup.quiet_while_importing()
        assert signal.getsignal(signal.SIGINT) is startup.interrupted_while_starting
        startup.python_handles_interrupts()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_interrupt_before_anything_started_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sm120.recipe import loader

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(loader, "load_recipe", interrupted)
    result = CliRunner().invoke(app, ["plan", "tiny", "--gpus", "1"])
    assert (result.exit_code, result.stderr) == (130, "interrupted\n")
