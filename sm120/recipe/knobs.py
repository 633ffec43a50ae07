"""The named settings .env files and the environment may carry.

A .env file uses plain names (PORT=8001), as docker compose does. The process environment
uses the same names prefixed with SM120_ (SM120_PORT=8001) because plain HOST or PORT are often
set by shells for other reasons; MODEL_DIR is also read unprefixed, as seed 000's scripts do.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sm120.core.errors import PlanError
from sm120.core.net import check_host

Target = Literal[
    "variant", "model_dir", "port", "host", "served_name", "thinking", "set", "arg", "key"
]


@dataclass(frozen=True)
class Knob:
    target: Target
    flag: str | None = None
    help: str = ""


KNOBS: dict[str, Knob] = {
    "RECIPE": Knob("set", help="recipe to serve (compose and the container entrypoint)"),
    "VARIANT": Knob("variant", help="comma-separated variants, applied in order"),
    "MODEL_DIR": Knob("model_dir", help="host folder holding the checkpoint"),
    "PORT": Knob("port", help="port the server listens on"),
    "HOST": Knob("host", help="address to bind (default 127.0.0.1)"),
    "SERVED_MODEL_NAME": Knob("served_name", help="model name clients send"),
    "ENABLE_THINKING": Knob("thinking", help="0 turns reasoning off where the recipe allows"),
    "TP_SIZE": Knob("arg", "tensor-parallel-size", "tensor parallel size"),
    "DCP_SIZE": Knob("arg", "decode-context-parallel-size", "decode context parallel size"),
    "MAX_MODEL_LEN": Knob("arg", "max-model-len", "longest context"),
    "MAX_NUM_SEQS": Knob("arg", "max-num-seqs", "concurrent sequences"),
    "GPU_MEMORY_UTILIZATION": Knob("arg", "gpu-memory-utilization", "GPU memory fraction"),
    "KV_CACHE_DTYPE": Knob("arg", "kv-cache-dtype", "KV cache dtype"),
    "KV_TIER_BACKEND": Knob("key", "kv_tier.backend", "KV tier beyond the GPU: native or lmcache"),
    "KV_TIER_CPU_GIB": Knob(
        "key", "kv_tier.cpu_gib", "host RAM for the KV tier, GiB (turns it on)"
    ),
    "KV_TIER_DISK_PATH": Knob("key", "kv_tier.disk_path", "LMCache disk tier folder"),
    "KV_TIER_DISK_GIB": Knob("key", "kv_tier.disk_gib", "LMCache disk tier size, GiB"),
    "RESTART": Knob("key", "monitor.restart", "no, on-failure or on-failure:N (relaunch on death)"),
    "SM120_SET": Knob("set", help="space-separated KEY=VALUE overrides, like --set"),
}

ENV_PREFIX = "SM120_"
# Names a .env may hold for compose.yaml itself, not for the plan.
COMPOSE_KEYS = ("IMAGE", "BIND_HOST", "SHM_SIZE")
# How close an unknown name must be to a known one to be taken for a typo of it. A .env is
# also the container's environment (compose's env_file), so other names are allowed; 0.8
# catches MAX_MODEL_LENN or TP_SZE and lets HOSTNAME, HF_HOME or CUDA_VERSION through.
_TYPO_CUTOFF = 0.8


@dataclass
class KnobValues:
    """What one layer (.env or environment) asks for."""

    variants: list[str] = field(default_factory=list)
    model_dir: str | None = None
    port: int | None = None
    host: str | None = None
    served_name: str | None = None
    thinking: bool | None = None
    sets: list[str] = field(default_factory=list)


def _parse_bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise PlanError(f"{name}={raw!r} is not a boolean", "use 1 or 0")


def _parse_port(name: str, raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise PlanError(f"{name}={raw[:40]!r} is not a port number", "use e.g. 8000") from None
    if not 1 <= port <= 65535:
        raise PlanError(f"{name}={raw[:40]} is not a port from 1 to 65535", "use e.g. 8000")
    return port


def check_setting_names(source: Mapping[str, str]) -> None:
    """A misspelled .env setting would be ignored without a word: name the one it resembles."""
    known = [*KNOBS, *COMPOSE_KEYS]
    for key in source:
        if key in KNOBS or key in COMPOSE_KEYS:
            continue
        # compose reads names case-sensitively: `port=8001` is as lost as `PROT=8001`.
        hits = difflib.get_close_matches(key.upper(), known, n=1, cutoff=_TYPO_CUTOFF)
        if hits:
            raise PlanError(
                f"unknown setting '{key}' in .env; did you mean '{hits[0]}'?",
                "fix the name (see .env.example); a misspelled setting would be ignored",
            )


def knob_values(source: dict[str, str], *, prefixed: bool) -> KnobValues:
    if not prefixed:
        check_setting_names(source)
    values = KnobValues()
    for name, knob in KNOBS.items():
        key = ENV_PREFIX + name if prefixed and not name.startswith(ENV_PREFIX) else name
        raw = source.get(key)
        if raw is None and prefixed and name == "MODEL_DIR":
            raw = source.get("MODEL_DIR")
        if raw is None or raw == "" or name == "RECIPE":
            continue
        _apply(values, key, knob, raw)
    return values


def _apply(values: KnobValues, key: str, knob: Knob, raw: str) -> None:
    if knob.target == "variant":
        values.variants += [v.strip() for v in raw.split(",") if v.strip()]
    elif knob.target == "model_dir":
        values.model_dir = raw
    elif knob.target == "port":
        values.port = _parse_port(key, raw)
    elif knob.target == "host":
        values.host = check_host(raw, where=key)
    elif knob.target == "served_name":
        values.served_name = raw
    elif knob.target == "thinking":
        values.thinking = _parse_bool(key, raw)
    elif knob.target == "set":
        values.sets += raw.split()
    elif knob.target in ("arg", "key"):
        # An engine flag or a dotted recipe key, applied as `--set` would.
        values.sets.append(f"{knob.flag}={raw}")
