"""The node agent, driven through SshNode exactly as over SSH (the `ssh` here runs the quoted
remote command locally): real processes, real process groups, real files."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import pytest

from sm120.engine.cluster import agent
from sm120.engine.cluster.node import NodeError, ProbeRequest, StartRequest
from sm120.engine.cluster.ssh_node import SshNode
from tests.fakes.cluster import FakeCluster, make_fake_cluster


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    return make_fake_cluster(tmp_path, monkeypatch)


@pytest.fixture
def node(fake: FakeCluster) -> SshNode:
    return SshNode("root@node-a", rank=1, python=sys.executable, run_root=str(fake.run_root))


def start(node: SshNode, script: str, name: str = "engine", **env: str) -> str:
    return node.start(
        StartRequest(
            deployment="d",
            run_id="run1",
            rank=node.rank,
            name=name,
            argv=(sys.executable, "-c", script),
            env=env,
            image="img",
        )
    )


def wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_start_runs_detached_with_env_and_quoting(node: SshNode, fake: FakeCluster) -> None:
    handle = start(
        node,
        "import os,time; print(\"it's\", os.environ['SECRET'], flush=True); time.sleep(30)",
        SECRET="s3 $x 'q'",
    )
    assert handle == f"{fake.run_root}/run1/node1-engine"
    assert node.status(handle).running
    wait_for(lambda: (Path(handle) / "out.log").read_text().strip() != "")
    assert (Path(handle) / "out.log").read_text() == "it's s3 $x 'q'\n"
    node.stop(handle, timeout=5)
    assert not Path(handle).exists()
    assert not (fake.run_root / "run1").exists()  # the run folder goes with its last process
    assert fake.ssh_calls() == ["root@node-a start", "root@node-a status", "root@node-a stop"]
    # The request (argv and environment) travelled on stdin: on no command line ssh saw.
    assert "s3 $x" not in fake.ssh_command_lines()
    assert "time.sleep(30)" not in fake.ssh_command_lines()


def test_stop_records_how_it_ended_and_leaves_no_process(node: SshNode) -> None:
    handle = start(
        node, "import time, subprocess; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    )
    pgid = int((Path(handle) / "pgid").read_text())
    wait_for(lambda: len(agent.group_members(pgid)) >= 3)
    ending = node.stop(handle, timeout=5)
    assert ending is not None and ending["signal"] == 15
    assert agent.group_members(pgid) == []


def in_session(sid: int) -> list[int]:
    """Live processes of session `sid`, read from /proc independently of the agent."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def test_stop_reaches_children_that_lead_their_own_group(node: SshNode) -> None:
    # Ray's workers each lead a process group inside the daemon's session.
    script = (
        "import os,subprocess,time; "
        "subprocess.Popen(['sleep','60'], preexec_fn=os.setpgrp); time.sleep(60)"
    )
    handle = start(node, script)
    pgid = int((Path(handle) / "pgid").read_text())
    wait_for(lambda: len(in_session(pgid)) >= 3)
    own_group = [pid for pid in in_session(pgid) if os.getpgid(pid) != pgid]
    assert len(own_group) == 1
    node.stop(handle, timeout=5)
    assert in_session(pgid) == []


def test_stop_falls_back_to_sigkill(node: SshNode) -> None:
    script = (
        "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    handle = start(node, script)
    wait_for(lambda: "up" in (Path(handle) / "out.log").read_text())
    started = time.monotonic()
    node.stop(handle, timeout=0.5)
    assert time.monotonic() - started < 8
    assert not Path(handle).exists()


def test_exit_is_recorded_and_follow_ends(node: SshNode) -> None:
    handle = start(node, "import sys; print('one'); print('two'); sys.exit(4)")
    assert list(node.follow(handle)) == ["one", "two"]
    state = node.status(handle)
    assert not state.running
    assert state.exit is not None and state.exit["returncode"] == 4
    node.stop(handle, timeout=1)


def test_status_of_a_stopped_process_is_gone(node: SshNode) -> None:
    handle = start(node, "import time; time.sleep(30)")
    node.stop(handle, timeout=5)
    state = node.status(handle)
    assert state.gone and not state.running


def test_missing_executable_is_a_node_error(node: SshNode) -> None:
    with pytest.raises(NodeError) as caught:
        node.start(
            StartRequest(
                deployment="d",
                run_id="r",
                rank=1,
                name="engine",
                argv=("/no/such/python",),
                env={},
                image="i",
            )
        )
    assert caught.value.one_line().startswith(
        "node1 (root@node-a): cannot start /no/such/python: [Errno 2] No such file or directory"
    )


def test_starting_twice_in_one_run_dir_is_refused(node: SshNode) -> None:
    handle = start(node, "import time; time.sleep(30)")
    try:
        with pytest.raises(NodeError, match="already holds a started process"):
            start(node, "import time; time.sleep(30)")
    finally:
        node.stop(handle, timeout=5)


def test_unreachable_node(node: SshNode, fake: FakeCluster) -> None:
    fake.take_down("root@node-a")
    with pytest.raises(NodeError) as caught:
        node.probe(ProbeRequest(image="i"))
    assert caught.value.one_line() == (
        "node1 (root@node-a): ssh failed: ssh: connect to host root@node-a port 22: Connection "
        "refused (hint: check that 'ssh HOST true' works without a password prompt (keys, "
        "known_hosts))"
    )


def test_wrong_engine_python(fake: FakeCluster) -> None:
    node = SshNode("n", rank=0, python="/no/python", run_root=str(fake.run_root))
    with pytest.raises(NodeError) as caught:
        node.probe(ProbeRequest(image="i"))
    assert caught.value.one_line().startswith("node0 (n): /no/python did not answer: ")
    assert caught.value.one_line().endswith(
        "(hint: --vllm-python must name the engine's Python, at the same path on every node)"
    )


def test_run_executes_a_short_command(node: SshNode) -> None:
    assert node.run("unused", ["echo", "hello world"], timeout=10) == (0, "hello world\n")
    code, _ = node.run("unused", ["false"], timeout=10)
    assert code == 1


def test_probe_reports_engine_interfaces_model_and_ports(node: SshNode, fake: FakeCluster) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        facts = node.probe(
            ProbeRequest(image="i", model_dir=str(fake.model), ports=(("127.0.0.1", port),))
        )
    assert facts["ports_in_use"] == [port]
    assert facts["interfaces"]["lo"]["address"] == "127.0.0.1"
    assert facts["interfaces"]["lo"]["mtu"] > 0
    digest = hashlib.sha256((fake.model / "config.json").read_bytes()).hexdigest()
    assert facts["model"] == {
        "exists": True,
        "revision": None,
        "files": {"config.json": f"sha256:{digest}"},
    }
    assert facts["engine"]["packages"]["pytest"]
    assert facts["nccl"] is None
    assert facts["python"] == sys.executable


def test_probe_of_a_missing_model_dir(node: SshNode, tmp_path: Path) -> None:
    facts = node.probe(ProbeRequest(image="i", model_dir=str(tmp_path / "nope")))
    assert facts["model"] == {"exists": False}


def test_hf_snapshot_gives_revision_and_blob_digests(tmp_path: Path) -> None:
    blob = "ab" * 32
    blobs = tmp_path / "models--x" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / blob).write_text("weights")
    snapshot = tmp_path / "models--x" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(blobs / blob)
    (snapshot / ".cache").mkdir()
    (snapshot / ".cache" / "ignored").write_text("x")
    assert agent._model(str(snapshot)) == {
        "exists": True,
        "revision": "0123abcd",
        "files": {"model.safetensors": f"sha256:{blob}"},
    }


def test_big_files_are_sampled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent, "WHOLE_HASH_LIMIT", 10)
    monkeypatch.setattr(agent, "SAMPLE", 4)
    one = tmp_path / "a.bin"
    one.write_bytes(b"0123456789abcdefXYZ")
    other = tmp_path / "b.bin"
    other.write_bytes(b"0123456789abcdefXYW")  # differs in the last bytes: caught
    middle = tmp_path / "c.bin"
    middle.write_bytes(b"0123457789abcdefXYZ")  # differs in the middle: not sampled
    assert agent._digest(one).startswith("sampled:")
    assert agent._digest(one) != agent._digest(other)
    assert agent._digest(one) == agent._digest(middle)


def test_nccl_version_comes_from_the_pip_package() -> None:
    assert agent._nccl({"nvidia-nccl-cu13": "2.30.7", "torch": "2"}) == "2.30.7"
    assert agent._nccl({"nvidia-nccl-cu12": "2.26.5"}) == "2.26.5"
    assert agent._nccl({"torch": "2"}) is None


def test_unknown_command_fails_in_json() -> None:
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", Path(agent.__file__).read_text(), "dance"],
        input="{}",
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ},
    )
    assert result.returncode == 1
    assert result.stdout.strip() == (
        '{"error": "unknown command \'dance\'; one of start, status, follow, stop, probe"}'
    )


def test_a_port_left_in_time_wait_is_not_in_use() -> None:
    import socket

    with socket.socket() as listener:
        # a rendezvous store or an API server of an earlier run, as they bind
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the listener's side closes first and waits in TIME_WAIT
        client.close()
        assert agent._in_use("127.0.0.1", port)  # still listening: in use
    assert not agent._in_use("127.0.0.1", port)


def test_stop_never_signals_a_stranger_given_the_recorded_pgid(node: SshNode) -> None:
    import subprocess

    handle = start(node, "import time; time.sleep(60)")
    pgid = int((Path(handle) / "pgid").read_text())
    assert (Path(handle) / "pgid.start").read_text() == str(agent._stat(pgid)[4])  # type: ignore[index]
    # The node rebooted, or the supervisor was killed with its engine: the number now
    # belongs to an unrelated program that leads its own session, as the supervisor did.
    for pid in agent.group_members(pgid):
        os.kill(pid, 9)
    wait_for(lambda: agent.group_members(pgid) == [])
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (Path(handle) / "pgid").write_text(str(stranger.pid))
        assert node.status(handle).running is False
        node.stop(handle, timeout=2)
        time.sleep(0.2)
        assert stranger.poll() is None, "the agent signalled a process it never started"
    finally:
        stranger.kill()
        stranger.wait()
