"""The P2P probe against the live machine: `sm120 doctor --p2p` and the launch's P2P gate."""

from __future__ import annotations

from collections.abc import Mapping

from sm120.doctor.gpu_source import probe_gpus
from sm120.doctor.needs import needs_from_plan
from sm120.doctor.p2p import P2PReport, ProbeLimits, probe_env, run_p2p_probe
from sm120.doctor.p2p_gate import P2PDecision, decide_p2p, read_boot_id
from sm120.doctor.run import Machine
from sm120.doctor.snapshot import Snapshot
from sm120.plan.resolve import LaunchPlan

# Ranks of the all-reduce when there is no GPU to give one each (the CPU/gloo run).
CPU_RANKS = 2


def plan_gpus(plan: LaunchPlan) -> tuple[int, ...]:
    """The GPU indices the plan runs on: CUDA_VISIBLE_DEVICES when it names them, else 0..N-1."""
    count = needs_from_plan(plan).gpus or 0
    visible = plan.env_dict.get("CUDA_VISIBLE_DEVICES", "")
    named = tuple(int(part) for part in visible.split(",") if part.strip().isdigit())
    return named[:count] if len(named) >= count > 0 else tuple(range(count))


def doctor_p2p(
    python: str,
    *,
    gpus: tuple[int, ...] | None = None,
    machine: Machine | None = None,
    limits: ProbeLimits | None = None,
) -> P2PReport:
    """Every pair of `gpus` (default: all GPUs here) and an all-reduce across them; on a
    machine without GPUs, a CPU all-reduce (gloo) of two ranks tries the same control flow."""
    machine = machine or Machine()
    if gpus is None:
        gpus = _all_gpus(probe_gpus(machine.run, machine.nvml).snapshot)
    world = len(gpus) if len(gpus) >= 2 else CPU_RANKS
    env = probe_env(machine.environ, gpus if len(gpus) >= 2 else None)
    return run_p2p_probe(python, world, env=env, limits=limits)


def launch_p2p_decision(
    plan: LaunchPlan,
    python: str,
    *,
    machine: Machine | None = None,
    environ: Mapping[str, str] | None = None,
) -> P2PDecision:
    """Before a multi-GPU start on PCIe-only GPUs: probe once per boot and topology."""
    machine = machine or Machine()
    gpus = plan_gpus(plan)
    if len(gpus) < 2:
        return P2PDecision()
    snapshot = probe_gpus(machine.run, machine.nvml).snapshot
    base = {**(environ if environ is not None else machine.environ), **plan.env_dict}
    return decide_p2p(
        gpus=gpus,
        topology=snapshot.topology if snapshot else None,
        plan_env=plan.env_dict,
        boot_id=read_boot_id(machine.read_text),
        probe=lambda: run_p2p_probe(python, len(gpus), env=probe_env(base, gpus)),
    )


def _all_gpus(snapshot: Snapshot | None) -> tuple[int, ...]:
    if snapshot is None:
        return ()
    return tuple(gpu.index for gpu in snapshot.gpus if gpu.index is not None)
