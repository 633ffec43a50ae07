"""A real Docker engine for the integration tests.

No registry is reachable from these machines, so the tests start their own `dockerd` (overlay2
storage where the kernel allows it, else vfs, which copies every layer in full; no iptables, no
bridge) on a private socket, and
stand in the public base image a Dockerfile names with one made locally by debootstrap. The
engine's data root is cached per machine so a second run reuses built layers; the daemon itself
is stopped when the test session ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

CACHE = Path(os.environ.get("SM120_TEST_DOCKER_CACHE", Path.home() / ".cache/sm120/test-docker"))
SOCKET = Path("/run/sm120-test-docker/docker.sock")
BASE_IMAGE = "python:3.11-slim"
DEBIAN_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Bumped whenever the stand-in changes, so a cached older one is replaced.
STANDIN_LABEL = "sm120.test-standin"
STANDIN_VERSION = "2"


class DockerUnavailable(RuntimeError):
    pass


def docker_host() -> str:
    return f"unix://{SOCKET}"


def _docker(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "-H", docker_host(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _engine_answers() -> bool:
    try:
        return _docker("version", "--format", "{{.Server.Version}}", timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def running_dockerd() -> Iterator[str]:
    """Yield DOCKER_HOST for a dockerd started here, and stop it afterwards."""
    if shutil.which("dockerd") is None:
        raise DockerUnavailable("dockerd is not installed (apt-get install docker.io)")
    if os.geteuid() != 0:
        raise DockerUnavailable("dockerd needs root on these machines")
    if _engine_answers():  # left over by an earlier run: reuse it, and leave it running
        yield docker_host()
        return
    SOCKET.parent.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    daemon: subprocess.Popen[bytes] | None = None
    for driver in ("overlay2", "vfs"):
        daemon = _start_dockerd(driver)
        if daemon is not None:
            break
    if daemon is None:
        raise DockerUnavailable(f"dockerd did not start; see {CACHE / 'dockerd.log'}")
    try:
        yield docker_host()
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def _start_dockerd(driver: str) -> subprocess.Popen[bytes] | None:
    """Start dockerd with one storage driver; None if it does not come up with it."""
    with (CACHE / "dockerd.log").open("ab") as log:
        daemon = subprocess.Popen(
            [
                "dockerd",
                "--host",
                docker_host(),
                "--data-root",
                str(CACHE / f"data-{driver}"),
                "--exec-root",
                str(SOCKET.parent / "exec"),
                "--pidfile",
                str(SOCKET.parent / "dockerd.pid"),
                f"--storage-driver={driver}",
                "--iptables=false",
                "--bridge=none",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not _engine_answers():
        if daemon.poll() is not None or time.monotonic() > deadline:
            daemon.kill()
            daemon.wait()
            return None
        time.sleep(0.5)
    return daemon


def _debian_mirror() -> str:
    for line in DEBIAN_SOURCES.read_text().splitlines():
        if line.startswith("URIs:"):
            return line.split()[1]
    return "http://deb.debian.org/debian"


def _make_rootfs_tarball(tarball: Path) -> None:
    """A Debian root filesystem that behaves like the public python:3.11-slim image."""
    rootfs = tarball.with_suffix(".rootfs")
    shutil.rmtree(rootfs, ignore_errors=True)
    subprocess.run(
        [
            "debootstrap",
            "--variant=minbase",
            # python3-dev: the public image ships Python's headers, and torch.compile's CPU
            # kernels include Python.h
            "--include=python3,python3-dev,python3-venv,python3-pip,ca-certificates,curl",
            "bookworm",
            str(rootfs),
            _debian_mirror(),
        ],
        check=True,
        capture_output=True,
        timeout=900,
    )
    # The machine reaches PyPI through a proxy whose CA only the host's bundle trusts.
    shutil.copy(HOST_CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
    for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    for name in ("python3", "python"):
        link = rootfs / "usr/local/bin" / name
        link.unlink(missing_ok=True)
        link.symlink_to("/usr/bin/python3")
    partial = tarball.with_suffix(".partial")
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
    partial.rename(tarball)
    shutil.rmtree(rootfs, ignore_errors=True)


def ensure_base_image(name: str = BASE_IMAGE) -> None:
    """Make `name` exist in the test engine (a local stand-in for the public image)."""
    found = _docker(
        "image", "inspect", name, "--format", '{{index .Config.Labels "' + STANDIN_LABEL + '"}}'
    )
    if found.returncode == 0 and found.stdout.strip() == STANDIN_VERSION:
        return
    tarball = CACHE / f"python-3.11-slim-rootfs-v{STANDIN_VERSION}.tar"
    if not tarball.is_file():
        _make_rootfs_tarball(tarball)
    with tarball.open("rb") as data:
        subprocess.run(
            [
                "docker", "-H", docker_host(), "import",
                "--change", f"LABEL {STANDIN_LABEL}={STANDIN_VERSION}", "-", name,
            ],
            stdin=data,
            check=True,
            capture_output=True,
            timeout=600,
        )  # fmt: skip


def remove_containers(label: str) -> None:
    ids = _docker("ps", "-aq", "--filter", f"label={label}").stdout.split()
    if ids:
        _docker("rm", "-f", *ids)


def containers_with(label: str) -> list[str]:
    return _docker("ps", "-aq", "--filter", f"label={label}").stdout.split()


def buildkit_path() -> str:
    """PATH with a Docker CLI that builds with BuildKit first: the 20.10 CLI of Debian's
    docker.io has it built in; a newer CLI without the buildx plugin cannot (sm120 build
    runs `docker build` with DOCKER_BUILDKIT=1)."""
    path = os.environ.get("PATH", "")
    cli = shutil.which("docker")
    if cli is not None and _has_buildx(cli):
        return path
    return f"/usr/bin:{path}" if Path("/usr/bin/docker").is_file() else path


def _has_buildx(cli: str) -> bool:
    try:
        found = subprocess.run(
            [cli, "buildx", "version"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0


@contextlib.contextmanager
def docker_session() -> Iterator[str]:
    """A running dockerd with the base image, DOCKER_HOST pointing at it and a BuildKit-capable
    `docker` first on PATH (`sm120 build` builds through the CLI); both restored after."""
    saved = {name: os.environ.get(name) for name in ("DOCKER_HOST", "PATH")}
    with running_dockerd() as host:
        os.environ["DOCKER_HOST"] = host
        os.environ["PATH"] = buildkit_path()
        try:
            ensure_base_image()
            yield host
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
