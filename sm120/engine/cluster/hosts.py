"""`--nodes HEAD,WORKER,...`: parse the host list and match it to the plan's layout."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sm120.core.errors import PlanError
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.schema import Recipe
from sm120.render.multinode import NodeAddress

# [user@]host, host a DNS name or an IPv4 address. Anything else (spaces, shell
# metacharacters, ports) is refused: ssh and Docker get exactly what was typed.
_NODE = re.compile(
    r"^(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]{0,31})@)?(?P<host>[A-Za-z0-9][A-Za-z0-9.-]{0,252})$"
)
NODES_HINT = (
    "--nodes HEAD,WORKER,... names each host once, the head first, e.g. --nodes spark1,spark2"
)


def parse_nodes(text: str) -> list[NodeAddress]:
    entries = [entry.strip() for entry in text.split(",")]
    if not any(entries):
        raise PlanError("--nodes is empty", NODES_HINT)
    nodes: list[NodeAddress] = []
    for entry in entries:
        match = _NODE.match(entry)
        if match is None:
            raise PlanError(f"--nodes: '{entry}' is not [user@]host", NODES_HINT)
        address = match["host"]
        if any(node.address == address for node in nodes):
            raise PlanError(f"--nodes names {address} twice", NODES_HINT)
        nodes.append(NodeAddress(host=entry, address=address))
    return nodes


# ssh's -o takes Keyword=value; the keyword is letters and digits (ssh_config(5)).
_SSH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}=[^\x00-\x1f\x7f]{1,1024}")
SSH_OPTION_HINT = "write Keyword=value, e.g. --ssh-option IdentityFile=~/.ssh/k"


def parse_ssh_options(options: Sequence[str]) -> tuple[str, ...]:
    for option in options:
        if not _SSH_OPTION.fullmatch(option):
            shown = option if len(option) <= 60 else option[:57] + "..."
            raise PlanError(f"--ssh-option {shown!r} is not Keyword=value", SSH_OPTION_HINT)
    return tuple(options)


def multinode_variants(recipe: Recipe) -> list[str]:
    return [name for name, variant in recipe.variants.items() if variant.multinode is not None]


def check_nodes_fit(plan: LaunchPlan, recipe: Recipe, nodes: list[NodeAddress]) -> None:
    layout = plan.multinode
    if layout is None:
        choices = multinode_variants(recipe)
        raise PlanError(
            f"{plan.recipe} has no multi-node layout in the chosen variants",
            f"pick one with -V: {', '.join(choices)}"
            if choices
            else "this recipe serves on one host only; drop --nodes",
        )
    if len(nodes) != layout.nodes:
        raise PlanError(
            f"--nodes names {len(nodes)} hosts but the layout runs on {layout.nodes}",
            NODES_HINT,
        )


def require_nodes(plan: LaunchPlan) -> None:
    """A multi-node plan cannot be served without the hosts to serve it on."""
    if plan.multinode is not None:
        raise PlanError(
            f"this plan spans {plan.multinode.nodes} hosts (multinode layout)",
            "pass --nodes HEAD,WORKER,... (the head first), or pick a single-host variant",
        )
