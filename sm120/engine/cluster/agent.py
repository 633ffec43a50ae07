"""The small program sm120 runs on each node of a multi-node deployment.

Usage: python -c "<this file>" COMMAND [REQUEST-JSON]   (else the request is read from stdin)

  start   run argv detached, in its own session under a tiny supervisor that records how it
          ended; prints {"pgid": N}
  status  {"running", "exit", "members"} of a started process
  follow  print the process's output from the beginning, until it has ended and all is shown
  stop    SIGTERM the process group, SIGKILL what is left after the timeout, remove the run dir
  probe   the facts preflight compares across nodes (engine packages, NCCL, interfaces, weights,
          GPUs, ports); prints one JSON object

Standard library only and one file, because its source travels over SSH (or into a container)
as the -c argument: nothing is installed on the nodes. The start request, which carries the
engine's environment and so the API key, comes on stdin, never on a command line.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PID_FILE = "pgid"
# The supervisor's start time (clock ticks since boot): a pgid alone may name another program
# once the supervisor has gone (a reboot, a kill -9), and stop must never signal that.
START_FILE = "pgid.start"
LOG_FILE = "out.log"
EXIT_FILE = "exit.json"
KILL_GRACE = 5.0
# Files up to this size are hashed whole; bigger ones by size plus their first and last
# SAMPLE bytes (hashing hundreds of GB on every launch would take minutes per node).
WHOLE_HASH_LIMIT = 64 << 20
SAMPLE = 8 << 20
HF_BLOB_NAME_LENGTH = 64
NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
SIOCGIFADDR = 0x8915


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    raw = sys.argv[2] if len(sys.argv) > 2 else sys.stdin.read()
    request = json.loads(raw or "{}")
    handlers = {
        "start": start,
        "status": status,
        "follow": follow,
        "stop": stop,
        "probe": probe,
    }
    if command not in handlers:
        fail(f"unknown command {command!r}; one of {', '.join(handlers)}")
    handlers[command](request)


def fail(message: str) -> None:
    print(json.dumps({"error": message}), flush=True)
    raise SystemExit(1)


def reply(payload: dict[str, Any]) -> None:
    print(json.dumps(payload), flush=True)


# --- start / status / stop ----------------------------------------------------------------


def start(request: dict[str, Any]) -> None:
    run_dir = Path(request["dir"])
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if (run_dir / PID_FILE).exists():
        fail(f"{run_dir} already holds a started process")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _supervise(request, write_end)  # never returns
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read().decode() or json.dumps({"error": "the supervisor died at start"})
    # The supervisor lives on (re-parented to init); the agent's work is done.
    print(answer, flush=True)
    raise SystemExit(0 if '"pgid"' in answer else 1)


def _supervise(request: dict[str, Any], report_fd: int) -> None:
    """In the forked child: lead a new session, run argv, record how it ended."""
    code = 0
    try:
        os.setsid()
        # Let go of the SSH session's pipes, or ssh would wait for the engine to end.
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        run_dir = Path(request["dir"])
        log = os.open(run_dir / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        env = dict(os.environ)
        env.update(request.get("env") or {})
        try:
            child = subprocess.Popen(
                request["argv"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=request.get("cwd") or run_dir,
            )
        except OSError as exc:
            os.write(
                report_fd,
                json.dumps({"error": f"cannot start {request['argv'][0]}: {exc}"}).encode(),
            )
            os._exit(1)
        # Set only after the child exists: ignored signals would be inherited across exec.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        own = _stat(os.getpid())
        if own is not None:
            _write_atomically(run_dir / START_FILE, str(own[4]))
        _write_atomically(run_dir / PID_FILE, str(os.getpid()))
        os.write(report_fd, json.dumps({"pgid": os.getpid(), "pid": child.pid}).encode())
        os.close(report_fd)
        returncode = child.wait()
        record = {"returncode": returncode, "signal": None, "ended_at": time.time()}
        if returncode < 0:
            record = {"returncode": None, "signal": -returncode, "ended_at": time.time()}
        if run_dir.is_dir():
            _write_atomically(run_dir / EXIT_FILE, json.dumps(record))
    except BaseException:  # a forked child must never return into the agent's code
        code = 1
    os._exit(code)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    Path(tmp).replace(path)


def _pgid(run_dir: Path) -> int | None:
    """The supervisor's process group as recorded (it may have ended since)."""
    try:
        pgid = int((run_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pgid if pgid > 1 else None


def owned_members(run_dir: Path, pgid: int) -> list[int]:
    """The live members of the supervisor's session, or none when the number may by now
    belong to another program."""
    return group_members(pgid) if _is_ours(run_dir, pgid) else []


def _is_ours(run_dir: Path, pgid: int) -> bool:
    try:
        started = int((run_dir / START_FILE).read_text().strip())
    except (OSError, ValueError):
        return True  # written by an agent from before start times were kept
    leader = _stat(pgid)
    if leader is not None and leader[4] == started:
        return True
    # The supervisor has ended: what it left in its session is ours if it started before
    # the recorded end (while the number was still taken, so nobody else could have it).
    ended = (_exit_record(run_dir) or {}).get("ended_at")
    boot = _boot_time()
    if not isinstance(ended, (int, float)) or boot is None:
        return False
    hertz = os.sysconf("SC_CLK_TCK")
    for pid in group_members(pgid):
        fields = _stat(pid)
        if fields is not None and fields[3] == pgid and boot + fields[4] / hertz <= ended + 1.0:
            return True
    return False


def _stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, ppid, pgrp, session, start ticks) from /proc/PID/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])


def _boot_time() -> float | None:
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _exit_record(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / EXIT_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes the supervisor's session holds: its process group, and the
    groups some engines give their own children (Ray's workers each lead one, in the same
    session). The supervisor leads the session, so session id = its pid = pgid."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        if pgid in (int(fields[2]), int(fields[3])) and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def signal_members(run_dir: Path, pgid: int, signum: int) -> None:
    for pid in owned_members(run_dir, pgid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def status(request: dict[str, Any]) -> None:
    run_dir = Path(request["dir"])
    pgid = _pgid(run_dir)
    if pgid is None:
        reply({"running": False, "exit": None, "members": 0, "gone": True})
        return
    members = len(owned_members(run_dir, pgid))
    record = _exit_record(run_dir)
    reply({"running": record is None and members > 0, "exit": record, "members": members})


def stop(request: dict[str, Any]) -> None:
    run_dir = Path(request["dir"])
    timeout = float(request.get("timeout", 30.0))
    pgid = _pgid(run_dir)
    killed = False
    if pgid is not None and owned_members(run_dir, pgid):
        # The supervisor ignores SIGTERM, so it stays to record how the engine ended.
        signal_members(run_dir, pgid, signal.SIGTERM)
        if not _wait_empty(run_dir, pgid, timeout):
            killed = True
            signal_members(run_dir, pgid, signal.SIGKILL)
            _wait_empty(run_dir, pgid, KILL_GRACE)
    record = _exit_record(run_dir)
    left = len(owned_members(run_dir, pgid)) if pgid is not None else 0
    shutil.rmtree(run_dir, ignore_errors=True)
    # The deployment's run folder goes with its last process.
    with contextlib.suppress(OSError):
        run_dir.parent.rmdir()
    reply({"exit": record, "killed": killed, "left": left})


def _wait_empty(run_dir: Path, pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while owned_members(run_dir, pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


# --- follow ---------------------------------------------------------------------------------


def follow(request: dict[str, Any]) -> None:
    """Like tail -f from the first line, ending once the process has ended (or its run dir
    was removed by stop) and everything it wrote was printed."""
    run_dir = Path(request["dir"])
    path = run_dir / LOG_FILE
    deadline = time.monotonic() + float(request.get("wait_s", 30.0))
    while not path.exists():
        if not run_dir.is_dir() or time.monotonic() > deadline:
            return
        time.sleep(0.1)
    out = sys.stdout.buffer
    with path.open("rb") as handle:
        while True:
            chunk = handle.read()
            if chunk:
                try:
                    out.write(chunk)
                    out.flush()
                except BrokenPipeError:
                    return
                continue
            if _exit_record(run_dir) is not None or not run_dir.is_dir():
                rest = handle.read()
                with contextlib.suppress(BrokenPipeError):
                    out.write(rest)
                    out.flush()
                return
            time.sleep(0.2)


# --- probe ----------------------------------------------------------------------------------


def probe(request: dict[str, Any]) -> None:
    packages = _packages()
    canonical = "\n".join(f"{name}=={version}" for name, version in sorted(packages.items()))
    facts = {
        "hostname": socket.gethostname(),
        "python": sys.executable,
        "engine": {
            "fingerprint": hashlib.sha256(canonical.encode()).hexdigest()[:16],
            "packages": packages,
        },
        "nccl": _nccl(packages),
        "interfaces": _interfaces(),
        "gpus": _gpus(),
    }
    if request.get("model_dir"):
        facts["model"] = _model(request["model_dir"])
    if request.get("ports"):
        facts["ports_in_use"] = [port for bind, port in request["ports"] if _in_use(bind, port)]
    reply(facts)


def _packages() -> dict[str, str]:
    found = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name:
            found[name] = dist.version
    return found


def _nccl(packages: dict[str, str]) -> str | None:
    for name in NCCL_PACKAGES:
        if name in packages:
            return packages[name]
    return None


def _interfaces() -> dict[str, dict[str, Any]]:
    interfaces = {}
    with contextlib.suppress(OSError):
        for base in sorted(Path("/sys/class/net").iterdir()):
            interfaces[base.name] = {
                "mtu": _read_int(base / "mtu"),
                "state": _read_text(base / "operstate"),
                "address": _ipv4(base.name),
            }
    return interfaces


def _ipv4(name: str) -> str | None:
    """The interface's primary IPv4 address (SIOCGIFADDR), without needing iproute2."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe_socket:
        try:
            packed = fcntl.ioctl(
                probe_socket.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode())
            )
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    return int(text) if text and text.isdigit() else None


def _gpus() -> list[dict[str, str]]:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return []
    try:
        result = subprocess.run(
            [binary, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in result.stdout.splitlines():
        name, _, cap = line.rpartition(",")
        if name:
            gpus.append({"name": name.strip(), "compute_cap": cap.strip()})
    return gpus


def _model(model_dir: str) -> dict[str, Any]:
    base = Path(model_dir)
    if not base.is_dir():
        return {"exists": False}
    real = base.resolve()
    files = {}
    for root, dirs, names in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if not name.startswith("."):
                path = Path(root) / name
                files[str(path.relative_to(base))] = _digest(path)
    return {
        "exists": True,
        # A Hugging Face cache snapshot directory is named after the commit it holds.
        "revision": real.name if real.parent.name == "snapshots" else None,
        "files": files,
    }


def _digest(path: Path) -> str:
    target = path.resolve().name
    if len(target) == HF_BLOB_NAME_LENGTH and all(c in "0123456789abcdef" for c in target):
        return f"sha256:{target}"  # the HF cache names each blob after its sha256
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        if size <= WHOLE_HASH_LIMIT:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            return f"sha256:{digest.hexdigest()}"
        digest.update(str(size).encode())
        digest.update(handle.read(SAMPLE))
        handle.seek(size - SAMPLE)
        digest.update(handle.read(SAMPLE))
    return f"sampled:{digest.hexdigest()}"


def _in_use(bind: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe_socket:
        # As the engine's listeners bind (torch.distributed's store and uvicorn set
        # SO_REUSEADDR): connections an earlier run left in TIME_WAIT do not count.
        probe_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe_socket.bind((bind, port))
        except OSError:
            return True
    return False


if __name__ == "__main__":
    main()
