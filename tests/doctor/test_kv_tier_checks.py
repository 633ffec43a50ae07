"""doctor's KV tier checks: pinned host RAM beside sleeping weights, and the disk folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from sm120.doctor.kv_tier_checks import check_kv_tier_disk, check_kv_tier_memory
from sm120.doctor.needs import Needs, needs_from_plan
from sm120.plan.resolve import PlanRequest, resolve

GIB = 1024**3


def meminfo(available_gib: float) -> str:
    return (
        f"MemTotal: {512 * 1024 * 1024} kB\nMemAvailable: {int(available_gib * 1024 * 1024)} kB\n"
    )


def free(gib: float) -> Callable[[str], SimpleNamespace]:  # disk_usage-shaped
    return lambda path: SimpleNamespace(total=1000 * GIB, used=0, free=int(gib * GIB))


def test_plan_needs_carry_the_tier_and_sleeping_weights() -> None:
    plan = resolve(PlanRequest("glm47", sets=("kv_tier.cpu_gib=64", "enable-sleep-mode=true")))
    needs = needs_from_plan(plan)
    assert needs.kv_tier_gib == 64
    assert needs.sleep_weights_gb == plan.model.size_gb
    assert needs_from_plan(resolve(PlanRequest("glm47"))).kv_tier_gib is None


def test_a_tier_that_fits_is_ok() -> None:
    [finding] = check_kv_tier_memory(meminfo(100), Needs(kv_tier_gib=64))
    assert finding.severity == "ok"
    assert "68.0 GiB of host RAM, 100.0 GiB available" in finding.message


def test_a_tier_beside_sleeping_weights_that_would_swap_is_refused_with_the_numbers() -> None:
    needs = Needs(kv_tier_gib=64, sleep_weights_gb=100.0)
    [finding] = check_kv_tier_memory(meminfo(150), needs)
    assert finding.severity == "error"
    assert finding.message == (
        "the KV tier pins 64 GiB, sleep mode moves 93.1 GiB of weights there, 4 GiB kept free: "
        "161.1 GiB of host RAM, 150.0 GiB available (the host would swap)"
    )
    assert finding.remediation == "lower kv_tier.cpu_gib to at most 53"


def test_no_tier_no_finding() -> None:
    assert check_kv_tier_memory(meminfo(1), Needs()) == []
    assert check_kv_tier_disk(Needs(), free(0)) == []


def test_disk_tier_folder_missing_full_or_fine(tmp_path: Path) -> None:
    missing = Needs(kv_tier_disk_path=str(tmp_path / "nope"), kv_tier_disk_gib=10)
    [finding] = check_kv_tier_disk(missing, free(100))
    assert (finding.severity, finding.remediation) == (
        "error",
        f"mkdir -p {tmp_path / 'nope'}, on a local NVMe disk",
    )
    needs = Needs(kv_tier_disk_path=str(tmp_path), kv_tier_disk_gib=10)
    [full] = check_kv_tier_disk(needs, free(4))
    assert full.severity == "error"
    assert full.message == f"the KV tier's disk wants 10 GiB at {tmp_path}, 4.0 GiB free"
    [readonly] = check_kv_tier_disk(needs, free(100), writable=lambda path: False)
    assert readonly.message == f"{tmp_path} is not writable"
    assert check_kv_tier_disk(needs, free(100))[0].severity == "ok"


def test_preflight_runs_the_tier_checks_for_a_plan_with_a_tier(tmp_path: Path) -> None:
    """Through preflight, on the fake GPU box (238 GiB available): a 300 GiB tier is an
    error that stops the launch, a missing disk folder another; 64 GiB passes."""
    from sm120.doctor import preflight
    from tests.fakes.gpu_box import gpu_box, machine

    disk = (
        "kv_tier.backend=lmcache",
        f"kv_tier.disk_path={tmp_path / 'missing'}",
        "kv_tier.disk_gib=100",
    )
    big = resolve(PlanRequest("glm47", sets=("kv_tier.cpu_gib=300", *disk)))
    found = {f.id: f for f in preflight(big, machine=machine(gpu_box()))}
    assert found["kv-tier-memory"].severity == "error"
    assert "238.4 GiB available (the host would swap)" in found["kv-tier-memory"].message
    assert found["kv-tier-disk"].severity == "error"
    fits = resolve(PlanRequest("glm47", sets=("kv_tier.cpu_gib=64",)))
    found = {f.id: f for f in preflight(fits, machine=machine(gpu_box()))}
    assert found["kv-tier-memory"].severity == "ok" and "kv-tier-disk" not in found
