"""The recipe's kv_tier: its spellings, what it renders to, and every refusal (rule K01)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.core.errors import PlanError
from sm120.plan.hardware import Hardware
from sm120.plan.resolve import PlanRequest, resolve
from sm120.plan.stored import plan_from_data, plan_to_data
from sm120.render.compose import render_compose_service
from sm120.render.container import ContainerPlacement, render_container
from sm120.render.environment import render_env
from tests.helpers import SM120_X4, argv_of, flag_value, invoke, plan_for

NATIVE_32 = ("kv_tier.cpu_gib=32",)
LMCACHE_DISK = (
    "kv_tier.backend=lmcache",
    "kv_tier.cpu_gib=64",
    "kv_tier.disk_path=/nvme/kv",
    "kv_tier.disk_gib=400",
)


def k01(recipe: str, *sets: str, variants: tuple[str, ...] = ()) -> object:
    hardware = Hardware(0, "cpu", "declared") if recipe == "tiny" else SM120_X4
    checked = plan_for(recipe, *variants, sets=sets, hardware=hardware)
    return next(r for r in checked.results if r.id == "K01")


def test_native_tier_renders_vllms_offloading_flags() -> None:
    argv = argv_of("glm47", sets=NATIVE_32, hardware=SM120_X4)
    assert flag_value(argv, "--kv-offloading-backend") == "native"
    assert flag_value(argv, "--kv-offloading-size") == "32"
    assert "--kv-transfer-config" not in argv


def test_lmcache_tier_renders_the_connector_and_per_rank_sizes() -> None:
    checked = plan_for("glm47", sets=LMCACHE_DISK, hardware=SM120_X4)
    argv = argv_of("glm47", sets=LMCACHE_DISK, hardware=SM120_X4)
    assert json.loads(flag_value(argv, "--kv-transfer-config") or "") == {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_both",
    }
    assert "--kv-offloading-backend" not in argv
    env = render_env(checked.plan)
    # glm47 runs TP 4: LMCache reads its sizes in each of the four workers.
    assert env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "16"
    assert env["LMCACHE_LOCAL_DISK"] == "file:///nvme/kv/"
    assert env["LMCACHE_MAX_LOCAL_DISK_SIZE"] == "100"
    assert env["LMCACHE_LOCAL_CPU"] == "True"
    assert "/nvme/kv:/nvme/kv" in render_compose_service(checked.plan)["volumes"]


def test_no_tier_renders_nothing_and_keeps_the_plan_hash() -> None:
    plain = resolve(PlanRequest("glm47"))
    assert plain.kv_tier is None
    assert not any(token.startswith("--kv-") for token in argv_of("glm47", hardware=SM120_X4))
    assert not any(name.startswith("LMCACHE_") for name in render_env(plain))
    assert resolve(PlanRequest("glm47", sets=NATIVE_32)).plan_hash != plain.plan_hash


def test_env_file_and_environment_spellings_match_set() -> None:
    by_set = resolve(PlanRequest("glm47", sets=("kv_tier.cpu_gib=24", "kv_tier.backend=native")))
    by_dotenv = resolve(
        PlanRequest("glm47", dotenv={"KV_TIER_CPU_GIB": "24", "KV_TIER_BACKEND": "native"})
    )
    by_environ = resolve(PlanRequest("glm47", environ={"SM120_KV_TIER_CPU_GIB": "24"}))
    assert by_set.kv_tier == by_dotenv.kv_tier == by_environ.kv_tier
    assert by_set.kv_tier is not None and by_set.kv_tier.cpu_gib == 24


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("kv_tier.backend=lmcache",), "kv_tier.cpu_gib: Field required"),
        (("kv_tier.cpu_gib=0",), "kv_tier.cpu_gib: Input should be greater than or equal to 0.125"),
        (
            ("kv_tier.cpu_gib=8", "kv_tier.disk_path=/nvme/kv", "kv_tier.disk_gib=10"),
            "a disk tier needs backend lmcache",
        ),
        (
            ("kv_tier.backend=lmcache", "kv_tier.cpu_gib=8", "kv_tier.disk_path=/nvme/kv"),
            "set disk_path and disk_gib together",
        ),
        (
            (
                "kv_tier.backend=lmcache",
                "kv_tier.cpu_gib=8",
                "kv_tier.disk_path=kv",
                "kv_tier.disk_gib=9",
            ),
            "disk_path 'kv' must be an absolute path",
        ),
        (
            ("kv_tier.cpu_gb=8",),
            "unknown recipe key 'kv_tier.cpu_gb'; did you mean 'kv_tier.cpu_gib'?",
        ),
    ],
)
def test_bad_tier_settings_are_refused(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(PlanError) as caught:
        resolve(PlanRequest("glm47", sets=sets))
    assert message in caught.value.message


def test_the_engine_flags_themselves_are_refused_with_the_recipe_spelling() -> None:
    with pytest.raises(PlanError) as caught:
        resolve(PlanRequest("glm47", sets=("kv-offloading-size=8",)))
    assert (
        caught.value.message == "'kv-offloading-size' is set by sm120 itself, not by a recipe flag"
    )
    assert "--set kv_tier.cpu_gib=32" in caught.value.hint


def test_glm47_native_tier_passes_k01() -> None:
    assert k01("glm47", *NATIVE_32).status == "pass"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("recipe", "sets", "variants", "reason"),
    [
        ("glm52", NATIVE_32, (), "KeyError ... indexer.k_cache"),
        ("glm52", ("kv_tier.backend=lmcache", "kv_tier.cpu_gib=8"), (), "LMCache/LMCache#1989"),
        ("dsv4", NATIVE_32, ("pr41834",), "vllm-project/vllm#43093"),
        ("dsv4", NATIVE_32, ("sglang",), "sm120 renders the KV tier for vLLM only"),
        (
            "glm47",
            ("kv_tier.backend=lmcache", "kv_tier.cpu_gib=8"),
            (),
            "does not ship the lmcache",
        ),
        ("tiny", ("kv_tier.cpu_gib=1",), (), "only supported on CUDA-alike and XPU GPUs"),
        (
            "glm47",
            ("kv_tier.cpu_gib=8", "image.engine_version=0.10.2"),
            (),
            "vllm 0.10.2 predates the native tier (vLLM 0.11.0)",
        ),
    ],
)
def test_k01_refuses_with_the_reason(
    recipe: str, sets: tuple[str, ...], variants: tuple[str, ...], reason: str
) -> None:
    result = k01(recipe, *sets, variants=variants)
    assert result.status == "fail"  # type: ignore[attr-defined]
    assert reason in " ".join(result.messages)  # type: ignore[attr-defined]


def test_k01_can_be_forced() -> None:
    checked = plan_for("glm52", sets=NATIVE_32, hardware=SM120_X4, force=("K01",))
    assert next(r for r in checked.results if r.id == "K01").status == "forced"


def test_plan_shows_the_tiers_tokens_from_the_gpu_pools_bytes_per_token() -> None:
    code, stdout, _ = invoke(
        CliRunner(),
        *("plan", "glm47", "--gpus", "4", "--json", "--set", "kv_tier.backend=lmcache"),
        *("--set", "kv_tier.cpu_gib=64", "--set", "kv_tier.disk_path=/nvme/kv"),
        *("--set", "kv_tier.disk_gib=256"),
    )
    assert code == 0
    document = json.loads(stdout)
    per_token = document["kv_bytes_per_token_per_rank"]
    tier = document["kv_tier"]
    assert tier["ranks"] == 4 and tier["pinned_host_gib"] == 64
    # 16 GiB per rank over the same bytes per token as the GPU pool: 364,722 tokens.
    assert tier["cpu_tokens"] == int(16 * 1024**3 / per_token) == 364_722
    assert tier["disk_tokens"] == int(64 * 1024**3 / per_token)
    plain = json.loads(invoke(CliRunner(), "plan", "glm47", "--gpus", "4", "--json")[1])
    assert "kv_tier" not in plain


def test_a_container_mounts_the_disk_tier_at_the_same_path(tmp_path: Path) -> None:
    plan = plan_for("glm47", sets=LMCACHE_DISK, hardware=SM120_X4).plan
    where = ContainerPlacement("glm47", cache_dir=tmp_path / "cache", hf_cache=tmp_path / "hf")
    container = render_container(plan, where)
    assert container["volumes"]["/nvme/kv"] == {"bind": "/nvme/kv", "mode": "rw"}
    assert container["environment"]["LMCACHE_LOCAL_DISK"] == "file:///nvme/kv/"


def test_a_stored_plan_keeps_its_tier() -> None:
    """The plan a cluster relaunch (or any reader of plan.json) gets back renders the same."""
    plan = resolve(PlanRequest("glm47", sets=LMCACHE_DISK))
    again = plan_from_data(json.loads(json.dumps(plan_to_data(plan))))
    assert again.kv_tier == plan.kv_tier
    assert render_env(again) == render_env(plan)


def test_the_dry_run_document_names_the_tier_and_who_set_it() -> None:
    from sm120.deploy.checked import plan_document

    document = plan_document(plan_for("glm47", sets=NATIVE_32, hardware=SM120_X4))
    assert document["kv_tier"] == {
        "backend": "native",
        "cpu_gib": 32.0,
        "disk_path": None,
        "disk_gib": None,
    }
    assert document["provenance"]["kv_tier.cpu_gib"] == "command line"
    assert "kv_tier" not in plan_document(plan_for("glm47", hardware=SM120_X4))


def test_plan_prints_the_tier_line() -> None:
    code, stdout, _ = invoke(
        CliRunner(), "plan", "glm47", "--gpus", "4", "--set", "kv_tier.cpu_gib=64"
    )
    assert code == 0
    assert (
        "KV tier (native): 364,722 tokens in 64 GiB of pinned host RAM (16 GiB per rank x 4)"
        in stdout
    )
