"""The local Docker engine, through the docker SDK: runtimes, builds and image queries.

Two other places reach Docker: a multi-node run's Docker node talks to its host's engine
with the SDK over ssh:// (sm120.engine.cluster.docker_node), and doctor runs the docker CLI
read-only, as a user would (sm120.doctor.host_checks). Callers of this module hand plain
data in (the renderer's `containers.run` arguments, a build context) and get plain data or
SDK objects back, so tests can pass a real engine or skip it.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error
from sm120.engine.docker_cli import DOCKER_CLI_ENV, build_cli

Progress = Callable[[str], None]


class DockerUnavailable(SM120Error):
    """The Docker engine cannot be reached (or the SDK is missing)."""


class DockerFailure(SM120Error):
    """Docker refused or failed an operation."""


def connect() -> Any:
    """A docker SDK client for DOCKER_HOST (or the default socket), checked with a ping."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - docker is a dependency
        raise DockerUnavailable("the docker SDK is not installed", "pip install docker") from exc
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        raise DockerUnavailable(
            f"cannot reach the Docker engine ({_first_line(exc)})",
            "start Docker, or point DOCKER_HOST at a running engine (sm120 doctor checks this)",
        ) from exc
    return client


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def sdk_run_kwargs(run: Mapping[str, Any]) -> dict[str, Any]:
    """Turn the renderer's JSON-able fields into the SDK objects containers.run expects."""
    from docker.types import DeviceRequest, Ulimit

    kwargs = dict(run)
    if "device_requests" in kwargs:
        kwargs["device_requests"] = [DeviceRequest(**req) for req in kwargs["device_requests"]]
    if "ulimits" in kwargs:
        kwargs["ulimits"] = [Ulimit(**limit) for limit in kwargs["ulimits"]]
    if "ports" in kwargs:
        kwargs["ports"] = {port: tuple(binding) for port, binding in kwargs["ports"].items()}
    return kwargs


def run_container(client: Any, run: Mapping[str, Any]) -> Any:
    kwargs = sdk_run_kwargs(run)
    image = kwargs.pop("image")
    try:
        return client.containers.run(image, **kwargs)
    except Exception as exc:
        raise DockerFailure(
            f"docker could not start {run.get('name')}: {_first_line(exc)}",
            "see 'sm120 doctor' (GPU runtime, image present, port and name free)",
        ) from exc


def containers_labelled(client: Any, labels: Mapping[str, str]) -> list[Any]:
    wanted = [f"{key}={value}" for key, value in labels.items()]
    return list(client.containers.list(all=True, filters={"label": wanted}))


def get_container(client: Any, ident: str) -> Any | None:
    from docker.errors import NotFound

    try:
        return client.containers.get(ident)
    except NotFound:
        return None


def container_host_pids(container: Any) -> list[int]:
    """A running container's processes as host pids ([] if Docker cannot list them)."""
    from docker.errors import APIError

    try:
        listing = container.top(ps_args="-o pid")
    except APIError:
        return []
    titles = [str(title).upper() for title in listing.get("Titles") or []]
    column = titles.index("PID") if "PID" in titles else 0
    return sorted(int(row[column]) for row in listing.get("Processes") or [])


def images_labelled(client: Any, labels: Mapping[str, str]) -> list[Any]:
    wanted = [f"{key}={value}" for key, value in labels.items()]
    return list(client.images.list(filters={"label": wanted}))


def get_image(client: Any, ref: str) -> Any | None:
    from docker.errors import ImageNotFound

    try:
        return client.images.get(ref)
    except ImageNotFound:
        return None


# The Docker CLI a build runs (BuildKit needs it: the SDK speaks only the classic builder,
# which has no cache mounts): sm120.engine.docker_cli picks one that can.


def build_image(
    context: bytes,
    *,
    dockerfile: str,
    tag: str,
    buildargs: Mapping[str, str],
    labels: Mapping[str, str],
    network_mode: str | None,
    no_cache: bool,
    progress: Progress,
) -> str:
    """Build with BuildKit from an in-memory tar context, streaming the build's output;
    return the image id."""
    cli = build_cli()
    with tempfile.TemporaryDirectory(prefix="sm120-build-") as tmp:
        iidfile = Path(tmp) / "iid"
        argv = [cli, "build", "--progress", "plain", "-f", dockerfile, "-t", tag]
        argv += ["--iidfile", str(iidfile)]
        for key, value in sorted(buildargs.items()):
            argv += ["--build-arg", f"{key}={value}"]
        for key, value in sorted(labels.items()):
            argv += ["--label", f"{key}={value}"]
        if network_mode:
            argv += ["--network", network_mode]
        if no_cache:
            argv.append("--no-cache")
        argv.append("-")
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        tail = _run_build(argv, context, env, progress)
        if not iidfile.exists():
            raise DockerFailure(
                "the image build failed: " + (tail[-1] if tail else "no output from Docker"),
                "the lines above show the failing step; fix it and run 'sm120 build' again",
            )
        return iidfile.read_text(encoding="utf-8").strip()


def _run_build(
    argv: list[str], context: bytes, env: dict[str, str], progress: Progress
) -> list[str]:
    """Run the build, the context on stdin; the last lines of its output."""
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )
    except OSError as exc:
        raise DockerUnavailable(
            f"cannot run the Docker CLI '{argv[0]}': {exc.strerror}",
            f"install the docker CLI, or point {DOCKER_CLI_ENV} at one",
        ) from exc
    assert process.stdin is not None and process.stdout is not None

    def feed() -> None:
        assert process.stdin is not None
        try:
            process.stdin.write(context)
        except BrokenPipeError:
            pass
        finally:
            process.stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    tail: list[str] = []
    for raw in process.stdout:
        line = raw.decode(errors="replace").rstrip()
        if line.strip():
            tail = [*tail[-20:], line]
            progress(line)
    feeder.join()
    if process.wait() != 0:
        return tail or ["docker build failed"]
    return tail


def read_file_from_container(container: Any, path: str) -> bytes | None:
    """A file's bytes from a (running or stopped) container, None if it is not there."""
    from docker.errors import NotFound

    try:
        chunks, _ = container.get_archive(path)
    except NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
        member = archive.next()
        handle = archive.extractfile(member) if member is not None else None
        return handle.read() if handle else None


def run_once(client: Any, image: str, argv: list[str]) -> str:
    """Run `argv` in a throwaway container of `image` (pulled if missing); its stdout."""
    if get_image(client, image) is None:
        try:
            client.images.pull(image)
        except Exception as exc:
            raise DockerFailure(
                f"cannot pull {image}: {_first_line(exc)}",
                "this needs the image's registry: run it on a machine that reaches it",
            ) from exc
    try:
        output = client.containers.run(
            image, argv[1:], entrypoint=[argv[0]], remove=True, network_mode="none"
        )
    except Exception as exc:
        raise DockerFailure(f"{argv[0]} failed in {image}: {_first_line(exc)}", "") from exc
    return bytes(output).decode()
