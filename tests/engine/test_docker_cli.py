"""`sm120 build` picks a Docker CLI that can build with BuildKit, or says in one line how to
get one (a machine here: /usr/local/bin/docker 28 without buildx before Debian's 20.10)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sm120.engine.docker_cli import NoBuildKitCli, build_cli, candidates, check_cli


def fake_docker(folder: Path, version: str, *, buildx: bool) -> Path:
    """A real executable answering `--version` and `buildx version` as that Docker would."""
    folder.mkdir(parents=True, exist_ok=True)
    cli = folder / "docker"
    buildx_code = 0 if buildx else 1
    cli.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = "--version" ] && echo "Docker version {version}, build abc" && exit 0\n'
        f'[ "$1" = "buildx" ] && exit {buildx_code}\n'
        "exit 2\n"
    )
    cli.chmod(0o755)
    return cli


@pytest.fixture(autouse=True)
def no_explicit_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SM120_DOCKER", raising=False)


def test_a_newer_cli_without_buildx_is_passed_over_for_one_with_buildkit_built_in(
    tmp_path: Path,
) -> None:
    new = fake_docker(tmp_path / "local", "28.2.2", buildx=False)
    old = fake_docker(tmp_path / "debian", "20.10.24+dfsg1", buildx=False)
    assert check_cli(str(new)).can_build is False
    assert build_cli(path_env=f"{new.parent}{os.pathsep}{old.parent}") == str(old)


def test_a_cli_with_the_buildx_plugin_is_taken_first(tmp_path: Path) -> None:
    new = fake_docker(tmp_path / "local", "28.2.2", buildx=True)
    old = fake_docker(tmp_path / "debian", "20.10.24", buildx=False)
    assert build_cli(path_env=f"{new.parent}{os.pathsep}{old.parent}") == str(new)


def test_none_that_can_build_is_one_line_naming_what_was_found_and_how_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    new = fake_docker(tmp_path / "local", "28.2.2", buildx=False)
    monkeypatch.setattr("sm120.engine.docker_cli.candidates", lambda _path: [str(new)])
    with pytest.raises(NoBuildKitCli) as caught:
        build_cli(path_env=str(new.parent))
    assert caught.value.one_line() == (
        f"no Docker CLI here can build with BuildKit: {new} (Docker 28) has no buildx plugin "
        "(hint: install the buildx plugin (Debian/Ubuntu: apt-get install docker-buildx, or "
        "docker-buildx-plugin from Docker's repository), or point SM120_DOCKER at a CLI that "
        "has it)"
    )


def test_sm120_docker_names_the_cli_outright(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM120_DOCKER", "/opt/docker-20/docker")
    assert build_cli(path_env="") == "/opt/docker-20/docker"


def test_the_same_file_twice_on_path_is_checked_once(tmp_path: Path) -> None:
    cli = fake_docker(tmp_path / "a", "20.10.24", buildx=False)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "docker").symlink_to(cli)
    found = candidates(f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    assert found[0] == str(cli)
    assert str(tmp_path / "b" / "docker") not in found
