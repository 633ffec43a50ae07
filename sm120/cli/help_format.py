"""One correction to Typer's help panels (typer pinned to 0.29.x in pyproject.toml).

Typer 0.29 writes a value type beside every option, flags included, so `--help`, `--yes`
and `--dry-run` read `<bool>` as if they took a value. A flag takes none: its type column
stays empty, as in Click's own help.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperOption

_typed = TyperOption.display_type_rich


def _flag_without_type(self: TyperOption, ctx: Any) -> str | None:
    if self.is_flag and self.metavar is None:
        return None
    return _typed(self, ctx)


def hide_flag_types() -> None:
    TyperOption.display_type_rich = _flag_without_type  # type: ignore[method-assign]
