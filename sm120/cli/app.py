"""Root of the `sm120` command. Command modules import their heavy dependencies inside the
command bodies so `sm120 --help` stays fast."""

from __future__ import annotations

import typer

from sm120 import __version__
from sm120.cli import (
    bench,
    chat,
    connect,
    dashboard,
    doctor,
    engine,
    evaluate,
    gates,
    gateway,
    images,
    launch,
    manage,
    monitor,
    plan_cmd,
    recipes,
    service,
    tune,
    validate,
    weights,
)
from sm120.cli.help_format import hide_flag_types

hide_flag_types()

app = typer.Typer(
    name="sm120",
    help="Serve frontier-size open models on NVIDIA SM120/SM121 Blackwell workstations.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"sm120 {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Serve frontier-size open models on NVIDIA SM120/SM121 Blackwell workstations."""


app.add_typer(recipes.app, name="recipes")
launch.register(app)
chat.register(app)
manage.register(app)
monitor.register(app)
app.add_typer(engine.app, name="engine")
validate.register(app)
images.register(app)
doctor.register(app)
plan_cmd.register(app)
weights.register(app)
service.register(app)
bench.register(app)
gates.register(app)
evaluate.register(app)
gateway.register(app)
connect.register(app)
dashboard.register(app)
tune.register(app)


def main() -> None:
    from sm120.core.startup import python_handles_interrupts

    python_handles_interrupts()
    app()
