"""What the dashboard's buttons do, handed in by whoever serves the page: the gateway hands
its swapper's actions (sm120.gateway.panel), so a deployment put to sleep here is one the
gateway knows to be asleep. The dashboard sits below the gateway and cannot import it."""

from __future__ import annotations

from typing import Literal, Protocol

Action = Literal["wake", "sleep", "stop", "relaunch"]
ACTIONS: tuple[Action, ...] = ("wake", "sleep", "stop", "relaunch")


class Controls(Protocol):
    async def act(self, action: Action, deployment: str) -> None:
        """Do it and return once done; an SM120Error says why it could not be done."""

    async def sleepers(self) -> dict[str, bool]:
        """Each deployment that can sleep (started in sleep mode), and whether it sleeps now."""

    def gateway(self) -> dict[str, object] | None:
        """The gateway's line of `sm120 status --json`, or None when none serves the page."""
