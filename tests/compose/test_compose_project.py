"""`sm120 compose A B`: golden projects, the single-recipe form unchanged byte for byte, the
keys kept out of every printed and written text, each refusal with its exact line, and the
real docker-compose binary accepting what is written.

Refresh the goldens after an intended change with:
    pytest tests/compose/test_compose_project.py --update-golden
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.helpers import GOLDEN_DIR, invoke, one_line_error

GOLDEN = GOLDEN_DIR / "compose"
# A fixed home keeps the generated tiny model's path stable across machines.
HOME = "/home/user/.local/state/sm120"
PROJECTS = {
    "tiny-fast": ["tiny", "fast=tiny", "--ports", "fast=8001"],
    "dsv4-glm52-split": [
        *("dsv4", "glm52", "--gpus", "dsv4=0,1", "--gpus", "glm52=device=2,3,4,5"),
        *("--ports", "glm52=8001", "--gateway-port", "9000"),
    ],
    "tiny-fast-hostnet": ["tiny", "fast=tiny", "--ports", "fast=8001", "--host-network"],
}


@pytest.fixture
def fixed_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM120_HOME", HOME)


def _write(cli: CliRunner, folder: Path, *args: str) -> tuple[int, str, str]:
    return invoke(cli, "compose", *args, "-o", str(folder / "compose.yaml"))


def _check_golden(path: Path, actual: str, request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--update-golden"):
        path.write_text(actual)
    assert path.is_file(), f"missing {path.name}: run pytest --update-golden"
    assert actual == path.read_text()


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_golden_project(
    name: str, cli: CliRunner, tmp_path: Path, fixed_home: None, request: pytest.FixtureRequest
) -> None:
    code, out, err = _write(cli, tmp_path, *PROJECTS[name])
    assert code == 0, err
    assert out == ""
    _check_golden(GOLDEN / f"{name}.yaml", (tmp_path / "compose.yaml").read_text(), request)
    backends = (tmp_path / "gateway-backends.json").read_text()
    _check_golden(GOLDEN / f"{name}.backends.json", backends, request)


def test_two_tiny_services_route_by_their_names(cli: CliRunner, tmp_path: Path) -> None:
    code, _, err = _write(cli, tmp_path, *PROJECTS["tiny-fast"])
    assert code == 0, err
    services = yaml.safe_load((tmp_path / "compose.yaml").read_text())["services"]
    assert list(services) == ["tiny", "fast", "gateway"]
    assert services["tiny"]["ports"] == ["127.0.0.1:8000:8000"]
    assert services["fast"]["ports"] == ["127.0.0.1:8001:8001"]
    assert services["gateway"]["ports"] == ["127.0.0.1:8808:8808"]
    fast = services["fast"]["command"]
    assert fast[fast.index("--served-model-name") + 1] == "fast"
    assert "healthcheck" in services["tiny"] and "healthcheck" in services["fast"]
    backends = json.loads((tmp_path / "gateway-backends.json").read_text())["backends"]
    assert [(b["model"], b["url"]) for b in backends] == [
        ("tiny", "http://tiny:8000"),
        ("fast", "http://fast:8001"),
    ]


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_no_two_engines_share_a_cache_volume(name: str, cli: CliRunner, tmp_path: Path) -> None:
    # dockerd fills a new volume from the image for each container that mounts it: two at
    # once fail one of them ("mkdir ...: file exists", moby/moby#43068).
    code, _, err = _write(cli, tmp_path, *PROJECTS[name])
    assert code == 0, err
    document = yaml.safe_load((tmp_path / "compose.yaml").read_text())
    owners: dict[str, list[str]] = {}
    for service, spec in document["services"].items():
        for mount in spec.get("volumes", []):
            source = mount.split(":")[0]
            if source in document["volumes"]:
                owners.setdefault(source, []).append(service)
    assert owners and all(len(services) == 1 for services in owners.values()), owners
    assert set(owners) == set(document["volumes"])


def test_a_project_reads_no_env_file(cli: CliRunner, tmp_path: Path) -> None:
    # A .env names one recipe's settings; a project's services keep their recipes' defaults.
    (tmp_path / ".env").write_text("PORT=8123\n")  # the tests run in tmp_path
    code, _, err = _write(cli, tmp_path, *PROJECTS["tiny-fast"])
    assert code == 0, err
    services = yaml.safe_load((tmp_path / "compose.yaml").read_text())["services"]
    assert services["tiny"]["ports"] == ["127.0.0.1:8000:8000"]


def test_gpu_sets_become_docker_device_ids(cli: CliRunner, tmp_path: Path) -> None:
    code, _, err = _write(cli, tmp_path, *PROJECTS["dsv4-glm52-split"])
    assert code == 0, err
    services = yaml.safe_load((tmp_path / "compose.yaml").read_text())["services"]
    devices = {
        name: services[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for name in ("dsv4", "glm52")
    }
    assert devices == {"dsv4": ["0", "1"], "glm52": ["2", "3", "4", "5"]}


@pytest.mark.parametrize(("recipe", "variants"), [("tiny", ()), ("glm52", ("-V", "seed"))])
def test_the_single_recipe_form_is_unchanged(
    recipe: str, variants: tuple[str, ...], cli: CliRunner, fixed_home: None
) -> None:
    # The goldens were written by main before `compose A B` existed; tiny's has since lost
    # the GPU rlimits a CPU container cannot always raise (compose.py says why). glm52's
    # default has since moved to DCP 1; its seed variant is the default those files were of.
    code, out, err = invoke(cli, "compose", recipe, *variants)
    assert code == 0, err
    assert out == (GOLDEN / f"single-{recipe}.yaml").read_text()


def test_keys_are_files_never_text(cli: CliRunner, tmp_path: Path) -> None:
    code, out, err = _write(cli, tmp_path, *PROJECTS["tiny-fast"])
    assert code == 0, err
    secrets = tmp_path / "secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    keys = {}
    for name in ("gateway_key", "tiny_key", "fast_key"):
        path = secrets / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        keys[name] = path.read_text()
        assert len(keys[name]) >= 32
    assert len(set(keys.values())) == 3
    written = (tmp_path / "compose.yaml").read_text() + (
        tmp_path / "gateway-backends.json"
    ).read_text()
    for key in keys.values():
        assert key not in written + out + err
    # Writing again keeps the keys: clients holding the gateway's key keep working.
    assert _write(cli, tmp_path, *PROJECTS["tiny-fast"])[0] == 0
    assert (secrets / "gateway_key").read_text() == keys["gateway_key"]


REFUSALS = [
    (
        ["tiny", "tiny"],
        "service 'tiny' is named twice (hint: name each one, and each serves its name: "
        "sm120 compose tiny tiny2=tiny)",
    ),
    (
        ["tiny", "fast=tiny"],
        "services tiny and fast both use port 8000 (hint: give one another port: "
        "--ports fast=PORT)",
    ),
    (
        ["tiny", "fast=tiny", "--ports", "fast=8808"],
        "service fast uses port 8808, the gateway's (hint: move one: --ports fast=PORT or "
        "--gateway-port PORT)",
    ),
    (
        ["tiny", "fast=tiny", "--ports", "fast=70000"],
        "--ports fast=70000: not a port (hint: a number from 1 to 65535)",
    ),
    (
        ["tiny", "fast=tiny", "--ports", "fast"],
        "--ports expects NAME=PORT, got 'fast' (hint: e.g. --ports fast=...)",
    ),
    (
        ["tiny", "fast=tiny", "--ports", "slow=8001"],
        "--ports names service 'slow', which is not in this compose (hint: services: tiny, fast)",
    ),
    (
        ["tiny", "Fast=tiny"],
        "'Fast=tiny': service name 'Fast' must be lowercase letters, digits, - or _ "
        "(hint: name it before the recipe: sm120 compose tiny fast=tiny)",
    ),
    (
        ["tiny", "gateway=tiny"],
        "'gateway=tiny': the service name 'gateway' is the gateway's "
        "(hint: name it another way: sm120 compose other=tiny)",
    ),
    (
        ["dsv4", "glm52", "--ports", "glm52=8001"],
        "services dsv4 and glm52 would share the GPUs: --gpus does not split them "
        "(hint: give each its own GPUs: --gpus dsv4=0,1 --gpus glm52=2,3)",
    ),
    (
        ["dsv4", "glm52", "--ports", "glm52=8001", "--gpus", "dsv4=0,1", "--gpus", "glm52=1,2,3,4"],
        "--gpus gives GPU 1 to both dsv4 and glm52 (hint: give each service its own GPUs)",
    ),
    (
        ["dsv4", "glm52", "--ports", "glm52=8001", "--gpus", "dsv4=0,1", "--gpus", "glm52=2,3"],
        "--gpus glm52=2,3 names 2 GPU(s) but recipe glm52 runs on 4 "
        "(hint: name 4 GPU indexes, e.g. --gpus glm52=0,1,2,3)",
    ),
    (
        ["tiny", "fast=tiny", "--ports", "fast=8001", "--gpus", "fast"],
        "--gpus expects NAME=GPUS, got 'fast' (hint: e.g. --gpus fast=...)",
    ),
    (
        ["tiny", "fast=tiny", "--ports", "fast=8001", "--gpus", "fast=0"],
        "service fast runs on the CPU (recipe tiny): no GPUs to place "
        "(hint: leave --gpus fast=... out)",
    ),
    (
        ["tiny", "fast=tiny", "--ports", "fast=8001", "--variant", "x"],
        "--variant, --model-dir and --port apply to one recipe, not a project "
        "(hint: with several recipes use --ports NAME=PORT; their variants are the defaults)",
    ),
]


@pytest.mark.parametrize(("args", "message"), REFUSALS, ids=[" ".join(a) for a, _ in REFUSALS])
def test_refusals(args: list[str], message: str, cli: CliRunner, tmp_path: Path) -> None:
    code, _, err = _write(cli, tmp_path, *args)
    assert code == 2
    assert one_line_error(err) == f"Error: {message}"
    # Nothing is written for a refused project.
    assert list(tmp_path.iterdir()) == []


def test_a_project_is_not_written_to_stdout(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "compose", "tiny", "fast=tiny", "--ports", "fast=8001")
    assert code == 2
    assert out == ""
    assert one_line_error(err) == (
        "Error: a compose project is written with its key files beside it, not to stdout "
        "(hint: pass -o FOLDER/compose.yaml)"
    )


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_docker_compose_accepts_the_project(name: str, cli: CliRunner, tmp_path: Path) -> None:
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose (Debian package) is installed by .ci/run"
    code, _, err = _write(cli, tmp_path, *PROJECTS[name])
    assert code == 0, err
    result = subprocess.run(
        [compose, "-f", str(tmp_path / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert "gateway" in config["services"]
    assert config["secrets"]["gateway_key"]["file"] == str(tmp_path / "secrets" / "gateway_key")
    gateway = config["services"]["gateway"]
    assert set(gateway["depends_on"]) == set(config["services"]) - {"gateway"}


def test_a_folder_that_does_not_exist_is_refused(cli: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "missing" / "compose.yaml"
    code, _, err = invoke(cli, "compose", *PROJECTS["tiny-fast"], "-o", str(target))
    assert code == 2
    assert one_line_error(err) == (
        f"Error: cannot write {tmp_path / 'missing' / 'secrets'}: No such file or directory "
        "(hint: pass -o a file in a folder that exists and is writable)"
    )
    assert list(tmp_path.iterdir()) == []
