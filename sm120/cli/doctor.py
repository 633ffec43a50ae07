"""`sm120 doctor [RECIPE]`: will it run here? `--from PATH`: will it run there (pasted
nvidia-smi outputs)? Exit 0 when nothing blocks, 1 when something does, 2 on bad input."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sm120.cli.errors import cli_errors
from sm120.cli.options import EnvFileOpt, HostOpt, PortOpt, SetsOpt, VariantsOpt, VllmPythonOpt

if TYPE_CHECKING:
    from sm120.doctor.findings import Finding
    from sm120.doctor.needs import Needs

_MARK = {
    "ok": "[green]ok[/green]  ",
    "info": "[cyan]info[/cyan]",
    "warn": "[yellow]WARN[/yellow]",
    "error": "[bold red]FAIL[/bold red]",
}


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def _needs(
    recipe: str | None,
    variant: list[str],
    sets: list[str],
    model_dir: str | None,
    port: int | None,
    host: str | None,
    env_file: Path | None,
) -> Needs:
    from sm120.core.defaults import DEFAULT_HOST, DEFAULT_PORT
    from sm120.doctor.needs import Needs, needs_from_plan

    if recipe is None:
        from sm120.recipe.loader import targets_by_arch

        targets = {arch: tuple(names) for arch, names in targets_by_arch().items()}
        return Needs(
            port=port or DEFAULT_PORT,
            host=host or DEFAULT_HOST,
            model_dir=model_dir,
            targets=targets,
        )
    from sm120.plan.request import plan_request
    from sm120.plan.resolve import resolve

    request = plan_request(
        recipe,
        environ=os.environ,
        variants=variant,
        sets=sets,
        model_dir=model_dir,
        port=port,
        host=host,
        env_file=env_file,
    )
    return needs_from_plan(resolve(request))


def _check_from(path: Path, report: Path | None) -> None:
    from sm120.core.errors import SM120Error

    if report is not None:
        raise SM120Error(
            "--report describes this machine and cannot be combined with --from",
            "run 'sm120 doctor --report FILE' on the machine itself",
        )
    if not path.exists():
        raise SM120Error(
            f"--from: {path} does not exist",
            "pass a file (or a folder of files) holding pasted nvidia-smi output",
        )


@cli_errors
def doctor(
    recipe: str | None = typer.Argument(
        None, help="Judge the machine for this recipe (GPU count, memory, disk); optional."
    ),
    variant: VariantsOpt = [],  # noqa: B006 - Typer copies it
    sets: SetsOpt = [],  # noqa: B006
    model_dir: str | None = typer.Option(
        None, "--model-dir", help="Where the weights are or go (disk check)."
    ),
    port: PortOpt = None,
    host: HostOpt = None,
    env_file: EnvFileOpt = None,
    vllm_python: VllmPythonOpt = None,
    from_path: Path | None = typer.Option(
        None, "--from", help="Diagnose pasted nvidia-smi outputs (a file or a folder) instead."
    ),
    report: Path | None = typer.Option(
        None,
        "--report",
        help="Write the environment report here (default: $SM120_HOME/doctor/environment.md).",
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    p2p: bool = typer.Option(
        False,
        "--p2p",
        help="Try GPU peer-to-peer copies between every pair and an all-reduce, in the "
        "engine's Python, each step with a hard timeout (F10). Without GPUs: a CPU (gloo) "
        "all-reduce.",
    ),
) -> None:
    """Will it run here? Read-only checks, each with a severity and a fix.

    Driver, GPUs, processes holding GPU memory, interconnect, engine (torch, vLLM), Docker
    and the NVIDIA runtime, disk, shared memory, port, RAM. Exit 0 when nothing blocks, 1
    when something does. Writes the environment report 'vllm collect-env' cannot give on
    uv-only installs. With --from, judges pasted nvidia-smi outputs instead."""
    needs = _needs(recipe, variant, sets, model_dir, port, host, env_file)
    if p2p:
        if from_path is not None:
            from sm120.core.errors import SM120Error

            raise SM120Error(
                "--p2p tries this machine's GPUs and cannot be combined with --from",
                "run 'sm120 doctor --p2p' on the machine itself",
            )
        raise typer.Exit(_p2p(needs, vllm_python, as_json))
    if from_path is not None:
        _check_from(from_path, report)
        raise typer.Exit(_captured(from_path, needs, as_json))
    raise typer.Exit(_live(needs, vllm_python, report, as_json))


def _live(needs: Needs, vllm_python: str | None, report: Path | None, as_json: bool) -> int:
    from sm120.doctor.report import (
        collect_system,
        default_report_path,
        environment_report,
        write_report,
    )
    from sm120.doctor.run import Machine, run_doctor

    machine = Machine()
    result = run_doctor(needs, machine=machine, engine_python=vllm_python)
    text = environment_report(result, collect_system(machine))
    target = report or default_report_path()
    try:
        written = write_report(text, target)
    except OSError as exc:
        from sm120.core.errors import SM120Error

        raise SM120Error(
            f"cannot write the environment report to {target} ({exc.strerror}: {exc.filename})",
            "pass --report with a writable path",
        ) from None
    if as_json:
        typer.echo(json.dumps({**result.document(), "report": str(written)}, indent=2))
    else:
        title = f"for {needs.recipe}" if needs.recipe else "(no recipe: the machine on its own)"
        _print_findings(f"sm120 doctor {title}", result.findings)
    sys.stderr.write(f"environment report: {written}\n")
    return 0 if result.ok else 1


def _p2p(needs: Needs, vllm_python: str | None, as_json: bool) -> int:
    from sm120.core.errors import SM120Error
    from sm120.doctor.p2p import p2p_findings
    from sm120.doctor.p2p_live import doctor_p2p
    from sm120.doctor.run import engine_python_for

    python = engine_python_for(vllm_python, os.environ)
    if python is None:
        raise SM120Error(
            "--p2p runs in the engine's Python, and none is known",
            "pass --vllm-python PATH, set VLLM_PYTHON, or run: sm120 engine install",
        )
    gpus = tuple(range(needs.gpus)) if needs.gpus and needs.gpus >= 2 else None
    report = doctor_p2p(python, gpus=gpus)
    findings = p2p_findings(report)
    if as_json:
        document = {**report.document(), "findings": [f.as_dict() for f in findings]}
        typer.echo(json.dumps(document, indent=2))
    else:
        where = f"{report.world} GPUs" if report.backend == "nccl" else "CPU ranks (no GPUs)"
        _print_findings(f"sm120 doctor --p2p: {where}, engine {python}", findings)
    return 0 if report.ok else 1


def _captured(path: Path, needs: Needs, as_json: bool) -> int:
    from sm120.doctor.run import diagnose_captured

    result = diagnose_captured(path, needs)
    if as_json:
        typer.echo(json.dumps(result.document(), indent=2))
    else:
        snap = result.snapshot
        kinds = ", ".join(snap.kinds) or "nothing"
        header = f"captured outputs from {path} ({len(result.files)} file(s)): {kinds}"
        _print_findings(header, result.findings)
    return 0 if result.ok else 1


def _print_findings(title: str, findings: list[Finding]) -> None:
    from rich.console import Console
    from rich.markup import escape

    from sm120.doctor.findings import blocking

    console = Console(highlight=False, soft_wrap=True)
    console.print(f"[bold]{escape(title)}[/bold]")
    for finding in findings:
        console.print(f"  {_MARK[finding.severity]}  {finding.id:<16} {escape(finding.message)}")
        if finding.remediation and finding.severity in ("warn", "error"):
            failure = f" ({finding.failure})" if finding.failure else ""
            console.print(f"  {'':6}  {'':<16} fix{failure}: {escape(finding.remediation)}")
    stops = blocking(findings)
    warns = sum(f.severity == "warn" for f in findings)
    verdict = "[bold red]blocked[/bold red]" if stops else "[green]nothing blocks[/green]"
    console.print(f"{verdict}: {len(stops)} blocking, {warns} warning(s)")
