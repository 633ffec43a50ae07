"""Before a multi-GPU start on PCIe-only GPUs: is GPU peer-to-peer safe here? (F10)

`sm120 launch` asks `decide_p2p` once per boot and topology: the P2P probe
(sm120/doctor/p2p.py) runs, its verdict is cached under $SM120_HOME/doctor/, and when P2P
failed the engine starts with NCCL_P2P_DISABLE=1, which sm120 sets itself and says so. A
reboot (new boot id), a BIOS change that moves the links (new topology) or other GPUs
(new key) probe again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120.core.paths import sm120_home
from sm120.doctor.p2p import P2PReport
from sm120.doctor.snapshot import Topology
from sm120.doctor.topology import interconnect

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
P2P_OFF = {"NCCL_P2P_DISABLE": "1"}


def cache_path() -> Path:
    return sm120_home() / "doctor" / "p2p-cache.json"


@dataclass(frozen=True)
class P2PDecision:
    """What the launch does about P2P: extra environment, and what to tell the user."""

    env: dict[str, str] = field(default_factory=dict)
    messages: tuple[str, ...] = ()
    probed: bool = False  # the probe ran for this launch (not cached, not skipped)
    verdict: dict[str, Any] | None = None  # the probe's report, fresh or from the cache


def cache_key(boot_id: str | None, topology: Topology, gpus: tuple[int, ...]) -> str | None:
    """Boot, links and GPUs in one key; None without a boot id (nothing to tie a cache to)."""
    if not boot_id:
        return None
    links = json.dumps(sorted(topology.links.items()))
    digest = hashlib.sha256(f"{links}|{list(gpus)}".encode()).hexdigest()[:16]
    return f"{boot_id.strip()}:{digest}"


def decide_p2p(
    *,
    gpus: tuple[int, ...],
    topology: Topology | None,
    plan_env: Mapping[str, str],
    boot_id: str | None,
    probe: Callable[[], P2PReport],
    cache_file: Path | None = None,
) -> P2PDecision:
    """Probe (or reuse a verdict) when several GPUs talk over PCIe only and P2P is on."""
    if len(gpus) < 2 or interconnect(topology) != "pcie" or topology is None:
        return P2PDecision()
    if plan_env.get("NCCL_P2P_DISABLE") == "1":
        return P2PDecision()
    cache_file = cache_file or cache_path()
    key = cache_key(boot_id, topology, gpus)
    cached = _read_cache(cache_file).get(key) if key else None
    if cached is not None:
        return _decision(cached, probed=False)
    report = probe()
    verdict = report.document()
    if report.error is not None:
        # The probe itself could not run: nothing was learnt about P2P, so nothing is cached.
        return P2PDecision(
            messages=(f"warning [F10]: the P2P probe did not run ({report.error})",),
            probed=True,
            verdict=verdict,
        )
    if key:
        _write_cache(cache_file, key, verdict)
    return _decision(verdict, probed=True)


def _decision(verdict: dict[str, Any], *, probed: bool) -> P2PDecision:
    source = "P2P probe" if probed else "P2P probe (cached for this boot and topology)"
    if verdict.get("ok"):
        return P2PDecision(
            messages=(f"{source}: GPU peer-to-peer works",), probed=probed, verdict=verdict
        )
    steps: list[dict[str, Any]] = verdict.get("steps", [])
    failed = next((step for step in steps if not step.get("ok")), {})
    what = f"{failed.get('step', 'a step')}: {failed.get('detail', 'failed')}"
    message = (
        f"{source} failed [{verdict.get('failure') or 'F10'}] ({what}); "
        "starting with NCCL_P2P_DISABLE=1 (NCCL goes through host memory)"
    )
    return P2PDecision(env=dict(P2P_OFF), messages=(message,), probed=probed, verdict=verdict)


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _write_cache(path: Path, key: str, verdict: dict[str, Any]) -> None:
    # Verdicts of earlier boots can never be hit again: keep only this boot's.
    boot = key.split(":", 1)[0]
    entries = {
        old: value for old, value in _read_cache(path).items() if old.split(":", 1)[0] == boot
    }
    entries[key] = verdict
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(entries, indent=2), encoding="utf-8")
    temporary.replace(path)


def read_boot_id(read_text: Callable[[str], str | None]) -> str | None:
    text = read_text(BOOT_ID_FILE)
    return text.strip() if text else None
