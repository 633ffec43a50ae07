"""Two "hosts" on one machine: network namespaces with their own addresses, each running sshd.

    root namespace: bridge BR 10.X.Y.254/24 (this machine, where sm120 runs)
    namespace A:    IFACE 10.X.Y.1/24, sshd on 10.X.Y.1:22
    namespace B:    IFACE 10.X.Y.2/24, sshd on 10.X.Y.2:22

Both interfaces carry the same name, like the fabric port of identical cluster nodes. The
namespaces share the file system (and so the engine and the model at the same paths) but not
the network: a process started over SSH in A listens on A's addresses only. Needs root,
iproute2 and openssh-server; .ci/run installs them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
IFACE = "mn0"
SSH_WAIT_S = 10.0


@dataclass(frozen=True)
class NetnsHost:
    namespace: str
    address: str
    sshd: subprocess.Popen[bytes]

    @property
    def target(self) -> str:
        return f"root@{self.address}"

    def pids(self) -> set[int]:
        """Every process whose network namespace is this host's."""
        out = run("ip", "netns", "pids", self.namespace, check=False).stdout
        return {int(pid) for pid in out.split()}


@dataclass(frozen=True)
class TwoHosts:
    hosts: tuple[NetnsHost, NetnsHost]
    bridge: str
    key: Path
    veths: tuple[str, ...] = ()
    ifname: str = IFACE

    @property
    def ssh_options(self) -> list[str]:
        return [
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            f"IdentityFile={self.key}",
            "IdentitiesOnly=yes",
        ]


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=60)


def missing_tools() -> list[str]:
    wanted = {"ip": shutil.which("ip"), "sshd": SSHD if Path(SSHD).exists() else None}
    wanted["ssh"] = shutil.which("ssh")
    wanted["ssh-keygen"] = shutil.which("ssh-keygen")
    return [name for name, path in wanted.items() if path is None]


def namespaces() -> set[str]:
    return {line.split()[0] for line in run("ip", "netns", "list").stdout.splitlines() if line}


def wait_links_gone(names: set[str], timeout: float = 10.0) -> set[str]:
    """Links the kernel still lists (a veth goes a moment after its namespace)."""
    deadline = time.monotonic() + timeout
    while names & links() and time.monotonic() < deadline:
        time.sleep(0.2)
    return names & links()


def links() -> set[str]:
    out = run("ip", "-o", "link", "show").stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


@contextlib.contextmanager
def two_hosts(workdir: Path) -> Iterator[TwoHosts]:
    """Build both hosts; on exit stop sshd and remove namespaces, links and keys again."""
    tag = f"sm{os.getpid() % 100000}"
    subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    bridge = f"{tag}br"
    names = (f"{tag}a", f"{tag}b")
    keys = _keys(workdir)
    made: list[NetnsHost] = []
    try:
        run("ip", "link", "add", bridge, "type", "bridge")
        run("ip", "addr", "add", f"{subnet}.254/24", "dev", bridge)
        run("ip", "link", "set", bridge, "up")
        for index, namespace in enumerate(names, start=1):
            address = f"{subnet}.{index}"
            _namespace(namespace, f"{tag}v{index}", bridge, address)
            made.append(NetnsHost(namespace, address, _sshd(namespace, address, keys)))
        for host in made:
            _wait_for_ssh(host, keys / "client")
        veths = tuple(f"{tag}v{index}" for index in (1, 2))
        yield TwoHosts((made[0], made[1]), bridge, keys / "client", veths)
    finally:
        for host in made:
            host.sshd.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                host.sshd.wait(timeout=10)
            if host.sshd.poll() is None:
                host.sshd.kill()
                host.sshd.wait(timeout=10)
        for namespace in names:
            run("ip", "netns", "del", namespace, check=False)
        run("ip", "link", "del", bridge, check=False)
        shutil.rmtree(keys, ignore_errors=True)


def _keys(workdir: Path) -> Path:
    keys = workdir / "ssh-keys"
    keys.mkdir(mode=0o700, parents=True)
    for name in ("host", "client"):
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name))
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    (keys / "authorized_keys").chmod(0o600)
    return keys


def _namespace(namespace: str, veth: str, bridge: str, address: str) -> None:
    run("ip", "netns", "add", namespace)
    # The namespace end gets the common fabric name; the root end joins the bridge.
    run("ip", "link", "add", veth, "type", "veth", "peer", "name", IFACE, "netns", namespace)
    run("ip", "link", "set", veth, "master", bridge, "up")
    run("ip", "-n", namespace, "link", "set", "lo", "up")
    run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", IFACE)
    run("ip", "-n", namespace, "link", "set", IFACE, "up")


def _sshd(namespace: str, address: str, keys: Path) -> subprocess.Popen[bytes]:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    argv = [
        "ip",
        "netns",
        "exec",
        namespace,
        SSHD,
        "-D",
        "-e",
        "-f",
        "/dev/null",
        "-o",
        f"ListenAddress={address}",
        "-o",
        f"HostKey={keys / 'host'}",
        "-o",
        f"AuthorizedKeysFile={keys / 'authorized_keys'}",
        "-o",
        "PermitRootLogin=prohibit-password",
        "-o",
        "StrictModes=no",
        "-o",
        "PidFile=none",
    ]
    log = (keys / f"sshd-{namespace}.log").open("wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def _wait_for_ssh(host: NetnsHost, key: Path) -> None:
    deadline = time.monotonic() + SSH_WAIT_S
    while True:
        probe = run(
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-i",
            str(key),
            host.target,
            "true",
            check=False,
        )
        if probe.returncode == 0:
            return
        if time.monotonic() > deadline or host.sshd.poll() is not None:
            raise RuntimeError(f"sshd in {host.namespace} did not answer: {probe.stderr.strip()}")
        time.sleep(0.2)
