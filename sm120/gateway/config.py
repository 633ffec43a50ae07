"""What a gateway is started with, and every default of it (the CLI options read these)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Only the type: the CLI reads these defaults, and `sm120 --help` must not load YAML.
    from sm120.gateway.aliases import Alias

DEFAULT_HOST = "127.0.0.1"
# Off vLLM's 8000 and the recipes' ports, so the gateway rarely takes an engine's port.
DEFAULT_PORT = 8808
# 0: the gateway routes only; it never starts, stops, sleeps or wakes a deployment.
DEFAULT_MAX_AWAKE = 0
# How long a request waits for its model to come up: a cold start of a big model may take
# 40 minutes, but a client should hear back sooner (503 + Retry-After); the swap goes on.
DEFAULT_SWAP_WAIT_S = 600.0
# Fair turns between keys on one engine (sm120.gateway.limits): while another key is busy on
# it, one key holds at most this part of the engine's --max-num-seqs slots ...
DEFAULT_BUSY_SHARE = 0.5
# ... and a lighter key's request that waits for its first token holds back the heavier
# keys' new requests for at most this long (0: never).
DEFAULT_FIRST_TOKEN_HOLD_S = 1.0


@dataclass(frozen=True)
class TurnPolicy:
    """How the gateway shares one engine's slots between keys (docs/gateway.md, "Fair
    turns")."""

    busy_share: float = DEFAULT_BUSY_SHARE
    first_token_hold_s: float = DEFAULT_FIRST_TOKEN_HOLD_S


@dataclass(frozen=True)
class GatewayConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    # How many deployments fit at once: past it, asking for another puts one away.
    max_awake: int = DEFAULT_MAX_AWAKE
    swap_wait_s: float = DEFAULT_SWAP_WAIT_S
    # Static mode (inside a compose project): backends from this file, not sm120's state.
    backends_file: Path | None = None
    # The gateway's key from this file (a compose secret) instead of its generated one.
    key_file: Path | None = None
    # Names clients ask for that reach a chosen deployment (sm120.gateway.aliases).
    aliases: tuple[Alias, ...] = ()
    # Opt-in: make prompts cache-friendly before they reach the engine (docs/gateway.md).
    normalize_prompts: bool = False
    # The access log (access.log in the gateway's folder); off only to measure what it costs.
    access_log: bool = True
    # Each request's key, model, tokens and timings in usage.db (sm120.gateway.usage).
    record_usage: bool = True
    # Opt-in: each request's prompt structure (lengths and hashes) for `gateway analyze`.
    request_log: bool = False
    # Fair turns between keys on one engine.
    turns: TurnPolicy = TurnPolicy()
