"""The tiny recipe's engine install is asked on a terminal only; elsewhere it is refused in
one line that names --yes (never a bare 'Aborted.', never a silent 3.4 GB install)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sm120.cli import serving
from sm120.engine import engine_env
from tests.helpers import free_port, invoke, one_line_error


@pytest.fixture(autouse=True)
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_PYTHON", raising=False)

    def never(dest: object, progress: object) -> None:
        raise AssertionError("the engine must not be installed")

    monkeypatch.setattr(engine_env, "provision_vllm_cpu", never)


def test_without_a_terminal_the_install_is_refused_naming_yes(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--port", str(free_port()))
    assert code == 2
    assert one_line_error(err).startswith(
        "Error: not asked without a terminal: install vllm-cpu 0.32.0 (3.4 GiB on disk"
    )
    assert err.rstrip().endswith("to serve tiny (hint: run again with --yes to agree)")


def test_end_of_input_at_the_prompt_is_a_no_with_the_same_hint(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving.TerminalView, "asker", lambda self: serving._ask)
    code, _, err = invoke(cli, "launch", "tiny", "--port", str(free_port()))
    assert code == 2
    assert "Aborted" not in err
    assert "Error: the engine is not installed" in err
    assert "run again with --yes" in err


def test_the_install_runs_in_its_own_view_before_the_engine_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from contextlib import contextmanager

    from sm120.deploy import launcher
    from tests.helpers import plan_for

    seen: list[str] = []

    @contextmanager
    def view(what: str):  # type: ignore[no-untyped-def]
        seen.append(f"phase: {what}")
        yield seen.append

    def provision(dest: object, progress: engine_env.Progress) -> None:
        progress("Progress 1 of 2")

    monkeypatch.setattr(launcher, "provision_vllm_cpu", provision)
    monkeypatch.setattr(launcher, "resolve_engine_python", lambda *a, **k: "/engine/python")
    options = launcher.LaunchOptions(name="tiny", confirm=None, provision_view=view)
    python = launcher.engine_python(plan_for("tiny").plan, options, never_shown)
    assert python == "/engine/python"
    assert seen == ["phase: vllm-cpu 0.32.0", "Progress 1 of 2"]


def never_shown(line: str) -> None:
    raise AssertionError(f"a plain progress line during the install: {line}")
