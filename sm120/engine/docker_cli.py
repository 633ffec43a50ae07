"""Which Docker CLI can run a BuildKit build here.

Docker 23 and later build with BuildKit only through the buildx plugin; without it
`docker build` stops with Docker's own "BuildKit is enabled but the buildx component is
missing" error. Docker 18.09 to 22.x carry BuildKit inside the CLI (DOCKER_BUILDKIT=1). A
machine may hold several CLIs (a newer one in /usr/local/bin from a tarball, Debian's
docker.io in /usr/bin): the first that can build is used.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120.core.errors import SM120Error

# SM120_DOCKER names the CLI to use, skipping the search.
DOCKER_CLI_ENV = "SM120_DOCKER"
# The first Docker CLI release that needs the buildx plugin for BuildKit.
BUILDX_REQUIRED_FROM = 23
PROBE_TIMEOUT_S = 10.0
_VERSION = re.compile(r"Docker version (\d+)\.")
INSTALL_HINT = (
    "install the buildx plugin (Debian/Ubuntu: apt-get install docker-buildx, or "
    "docker-buildx-plugin from Docker's repository), "
    f"or point {DOCKER_CLI_ENV} at a CLI that has it"
)

Probe = Callable[[Sequence[str]], tuple[int, str]]


class NoBuildKitCli(SM120Error):
    """No Docker CLI on this machine can build with BuildKit."""


@dataclass(frozen=True)
class CliCheck:
    path: str
    major: int | None  # None: `--version` did not answer
    buildx: bool

    @property
    def can_build(self) -> bool:
        if self.buildx:
            return True
        return self.major is not None and self.major < BUILDX_REQUIRED_FROM

    def describe(self) -> str:
        if self.major is None:
            return f"{self.path} does not answer --version"
        return f"{self.path} (Docker {self.major}) has no buildx plugin"


def _probe(argv: Sequence[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return 127, ""
    return done.returncode, done.stdout


def candidates(path_env: str | None = None) -> list[str]:
    """Every `docker` on PATH, in order, then Debian's; one entry per real file."""
    folders = (path_env if path_env is not None else os.environ.get("PATH", "")).split(os.pathsep)
    found: list[str] = []
    seen: set[Path] = set()
    for folder in [*folders, "/usr/bin"]:
        if not folder:
            continue
        cli = Path(folder) / "docker"
        if cli.is_file() and os.access(cli, os.X_OK) and cli.resolve() not in seen:
            seen.add(cli.resolve())
            found.append(str(cli))
    return found


def check_cli(path: str, probe: Probe = _probe) -> CliCheck:
    code, out = probe([path, "--version"])
    version = _VERSION.search(out) if code == 0 else None
    major = int(version.group(1)) if version else None
    buildx = major is not None and probe([path, "buildx", "version"])[0] == 0
    return CliCheck(path, major, buildx)


def build_cli(probe: Probe = _probe, path_env: str | None = None) -> str:
    """The Docker CLI to build with: SM120_DOCKER, else the first BuildKit-capable one."""
    explicit = os.environ.get(DOCKER_CLI_ENV)
    if explicit:
        return explicit
    checked = [check_cli(path, probe) for path in candidates(path_env)]
    for check in checked:
        if check.can_build:
            return check.path
    if not checked:
        raise NoBuildKitCli("no docker CLI found on PATH", "install Docker's CLI (docker.io)")
    raise NoBuildKitCli(
        "no Docker CLI here can build with BuildKit: "
        + "; ".join(check.describe() for check in checked),
        INSTALL_HINT,
    )
