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


def shared_engines_home() -> Path:
    """Where engine environments live for every sm120 on this machine: the user's cache
    (an engine is rebuilt from its pins, so it is a cache, not state). `sm120 launch tiny` and
    the test suite provision into the same folder, so a newcomer pays 3.4 GB once."""
    xdg_cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg_cache).expanduser() if xdg_cache else Path.home() / ".cache"
    return base / "sm120" / "engines"


def engines_home() -> Path:
    """The shared folder, unless SM120_HOME is set: a home chosen by hand (a test, a service
    user) keeps its engines inside it, like everything else."""
    explicit = os.environ.get("SM120_HOME")
    if explicit:
        return Path(explicit).expanduser() / "engines"
    return shared_engines_home()
