"""Where sm120 keeps what outlives one command: deployments, models, engines, history."""

from __future__ import annotations

import os
from pathlib import Path

from sm120.core.errors import SM120Error


class HomeError(SM120Error):
    """sm120's home names something that is not a folder."""


def sm120_home() -> Path:
    """sm120's state folder, refused when it names something that is not a folder: read as
    an empty tree it would have `status` say nothing is deployed while engines run, and
    `gateway status` say none runs. Every path of the state tree comes from here."""
    explicit = os.environ.get("SM120_HOME")
    if explicit:
        home = Path(explicit).expanduser()
        what = f"SM120_HOME {home}"
    else:
        xdg_state = os.environ.get("XDG_STATE_HOME")
        base = Path(xdg_state).expanduser() if xdg_state else Path.home() / ".local" / "state"
        home = base / "sm120"
        what = f"sm120's state folder {home}"
    if home.exists() and not home.is_dir():
        raise HomeError(
            f"{what} is a file, not a folder",
            "point SM120_HOME at a folder (or unset it for ~/.local/state/sm120)"
            if explicit
            else f"move the file {home} aside; sm120 makes its folder there",
        )
    return home


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
    if os.environ.get("SM120_HOME"):
        return sm120_home() / "engines"
    return shared_engines_home()
