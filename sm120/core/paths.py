"""Where sm120 keeps what outlives one command: deployments, models, engines, history."""

from __future__ import annotations

import os
from pathlib import Path


def sm120_home() -> Path:
    explicit = os.environ.get("SM120_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg_state = os.environ.get("XDG_STATE_HOME")
    if xdg_state:
        return Path(xdg_state).expanduser() / "sm120"
    return Path.home() / ".local" / "state" / "sm120"
