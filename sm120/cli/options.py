"""Options several commands share, as `Annotated` aliases: one spelling, one help text.

Defaults come from sm120.core.defaults, where the library reads them too. This module is
imported with every command module, so it imports nothing heavier than that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sm120.core.defaults import DEFAULT_ENV_FILE, DEFAULT_HOST

VariantsOpt = Annotated[list[str], typer.Option("--variant", "-V", help="Variant(s), in order.")]
SetsOpt = Annotated[
    list[str],
    typer.Option("--set", help="KEY=VALUE: an engine flag without dashes or a recipe key."),
]
ModelDirOpt = Annotated[
    str | None,
    typer.Option("--model-dir", help="Checkpoint folder; its config.json wins over the recipe."),
]
PortOpt = Annotated[int | None, typer.Option("--port", help="Port (default: the recipe's).")]
HostOpt = Annotated[
    str | None, typer.Option("--host", help=f"Bind address (default {DEFAULT_HOST}).")
]
EnvFileOpt = Annotated[
    Path | None,
    typer.Option("--env-file", help=f"A .env file (default ./{DEFAULT_ENV_FILE} if it exists)."),
]
VllmPythonOpt = Annotated[
    str | None,
    typer.Option("--vllm-python", help="The engine's Python (else $VLLM_PYTHON / managed env)."),
]
# Commands that find one deployment: by name, or the only one there is.
DeploymentOpt = Annotated[
    str | None, typer.Option("--name", help="Deployment (default: the only one).")
]
# `sm120 status NAME` and `sm120 stop NAME` also take the name as an argument.
NameAsArgumentOpt = Annotated[str | None, typer.Option("--name", help="Same as the argument.")]
NoThinkRequestOpt = Annotated[bool, typer.Option("--no-think", help="Ask the model not to reason.")]
