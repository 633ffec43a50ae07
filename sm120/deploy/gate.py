"""`sm120 launch --gate`: correctness suites a deployment must pass before READY is
announced, and what happens when it does not (stopped, unless --keep-on-fail).

The suites themselves are sm120.measure's; `sm120 test` runs them through the same helpers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error
from sm120.deploy.launcher import Ready
from sm120.deploy.stop import stop_sequence
from sm120.engine.runtime.base import Runtime
from sm120.measure.cases import Case, builtin_gates, load_gates, select
from sm120.measure.gate_report import case_lines, known_failure_lines, summary_line
from sm120.measure.gates import GateOptions, run_cases
from sm120.measure.target import Target, target_for_deployment

Echo = Callable[[str], None]


@dataclass(frozen=True)
class GateRequest:
    """`launch --gate`: suites to pass before READY is announced."""

    suites: tuple[str, ...]
    keep_on_fail: bool = False
    max_tokens: int | None = None


def split_suites(suites: list[str]) -> list[str]:
    names = [s.strip() for item in suites for s in item.split(",") if s.strip()]
    if not names:
        raise SM120Error("no gate suite named", "e.g. sm120 test core")
    return names


def gate_request(
    suites: list[str], keep_on_fail: bool, max_tokens: int | None
) -> GateRequest | None:
    """Checked before anything starts: a typo in a suite name must not cost a model load."""
    if not suites:
        if keep_on_fail or max_tokens is not None:
            raise SM120Error("--keep-on-fail and --gate-max-tokens need --gate", "e.g. --gate core")
        return None
    names = split_suites(suites)
    for suite in names:
        select(builtin_gates(), suite)
    return GateRequest(tuple(names), keep_on_fail, max_tokens)


def chosen_cases(
    suites: list[str], cases_file: Path | None = None, case_ids: tuple[str, ...] = ()
) -> list[tuple[str, tuple[Case, ...]]]:
    """Load and select before anything talks to a server: a typo costs nothing."""
    gates = load_gates(cases_file)
    return [(suite, select(gates, suite, case_ids)) for suite in suites]


def run_gate_suites(
    target: Target,
    chosen: list[tuple[str, tuple[Case, ...]]],
    options: GateOptions,
    *,
    echo: Echo | None,
) -> list[dict[str, Any]]:
    """Run the suites in order; `echo` gets the lines of each case as it finishes."""

    def show(result: dict[str, Any]) -> None:
        if echo is not None:
            for line in case_lines(result):
                echo(line)

    random = builtin_gates().random_model if target.random_model else None
    return [run_cases(target, suite, cases, options, show, random) for suite, cases in chosen]


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


def run_launch_gate(
    ready: Ready, runtime: Runtime, gate: GateRequest, echo: Echo = _to_stderr
) -> int:
    """0 when every case passed; else 1, with the server stopped unless keep_on_fail."""
    suites = ", ".join(gate.suites)
    echo(f"gate: running {suites} before announcing READY")
    failure = _gate_failure(ready.state.name, gate, echo)
    if failure is None:
        return 0
    if gate.keep_on_fail:
        echo(f"Error: {failure}; the server keeps running (--keep-on-fail)")
        return 1
    # The whole stop sequence, monitor first: its watchdog must not relaunch what the gate
    # stops.
    stop_sequence(ready.state, runtime=runtime)
    echo(
        f"Error: {failure}; the server was stopped (hint: the failed cases are listed above; "
        "--keep-on-fail keeps it running to investigate)"
    )
    return 1


def _gate_failure(name: str, gate: GateRequest, echo: Echo) -> str | None:
    """What failed, in words, or None when every case passed."""
    suites = ", ".join(gate.suites)
    try:
        target = target_for_deployment(name)
        chosen = chosen_cases(list(gate.suites))
        reports = run_gate_suites(
            target, chosen, GateOptions(max_tokens=gate.max_tokens), echo=echo
        )
    except SM120Error as exc:
        return f"the {suites} gate could not run: {exc.one_line()}"
    for report in reports:
        echo(summary_line(report))
        for line in known_failure_lines(report):
            echo(f"  {line}")
    failed = [r for r in reports if r["failed"]]
    if not failed:
        return None
    counts = ", ".join(f"{r['suite']} {r['failed']} of {r['failed'] + r['passed']}" for r in failed)
    return f"the gate failed ({counts} cases failed)"
