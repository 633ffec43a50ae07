"""What `sm120 compose` is asked for: one request covering both forms, a standalone compose
file of one recipe or a project of several with the gateway in front of them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sm120.gateway.config import DEFAULT_HOST, DEFAULT_PORT


@dataclass(frozen=True)
class ComposeRequest:
    # Each `[NAME=]RECIPE`: NAME names the service and is the model name it serves.
    recipes: tuple[str, ...]
    # The compose file; None: stdout (one recipe only: a project has key files beside it).
    output: Path | None = None
    # One recipe only: its variants, checkpoint folder and port.
    variants: tuple[str, ...] = ()
    model_dir: str | None = None
    port: int | None = None
    # A project: `NAME=PORT` and `NAME=GPUS` (0,1 or device=3), by service name.
    ports: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    gateway_port: int = DEFAULT_PORT
    gateway_host: str = DEFAULT_HOST
    # Every container on the host's network (for Docker engines without a bridge network).
    host_network: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_project(self) -> bool:
        """Several recipes, a named one, or an option only a project has."""
        return (
            len(self.recipes) > 1
            or "=" in self.recipes[0]
            or bool(self.ports or self.gpus or self.host_network)
        )
