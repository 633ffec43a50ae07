"""Whether this launch wards its engine (sm120.plan.ward says whether the engine ref can; the
operator may say no), and where its unix socket is."""

from __future__ import annotations

import os

from sm120.engine.state import engine_socket_path
from sm120.plan.resolve import LaunchPlan
from sm120.plan.ward import ward_route

# SM120_WARD=off leaves every engine on its port, as before the ward (for a look at an
# engine's own routes on a box nobody else uses).
WARD_SETTING = "SM120_WARD"


def ward_wanted() -> bool:
    return os.environ.get(WARD_SETTING, "on").strip().lower() not in ("off", "0", "no", "false")


def warded_socket(plan: LaunchPlan, deployment: str, *, create: bool = True) -> str | None:
    """The unix socket a warded engine listens on, or None when the engine keeps its port
    (an engine ref that cannot serve on a socket, or SM120_WARD=off). `create=False` for a
    dry run: the path only, nothing made."""
    if not ward_wanted() or not ward_route(plan).warded:
        return None
    return str(engine_socket_path(deployment, create=create))
