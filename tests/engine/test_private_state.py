"""The state tree (API keys, logs with prompts, what `stop` acts on) is its owner's alone:
folders 0700, files 0600, and trees of older versions are tightened as they are used."""

from __future__ import annotations

import stat
from pathlib import Path

from sm120.core.pidlock import PidLock
from sm120.doctor.report import default_report_path, write_report
from sm120.engine.runtime.native import NativeRuntime
from sm120.engine.state import deployment_dir, deployment_lock
from sm120.measure import history
from sm120.monitor.files import MonitorFiles
from tests.fakes.standin import spec_for
from tests.helpers import wait_for


def modes(root: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.stat().st_mode)
    return found


def assert_private(root: Path) -> None:
    loose = {
        name: oct(mode)
        for name, mode in modes(root).items()
        if mode & 0o077 or (mode != 0o700 and (root / name).is_dir())
    }
    assert loose == {}


def test_a_native_run_leaves_only_private_files(isolated_home: Path, tmp_path: Path) -> None:
    runtime = NativeRuntime()
    log = deployment_dir("demo") / "logs" / "serve.log"
    with deployment_lock("demo", "launch"):
        state = runtime.start(spec_for(tmp_path, "print('hello', flush=True)"), log)
    wait_for(lambda: runtime.exit_info(state) is not None)
    files = MonitorFiles(deployment_dir("demo"))
    files.make_dirs()
    lock = PidLock(files.pid)
    assert lock.acquire()
    lock.release()

    written = {"state.json", "exit.json", "lock", "logs/serve.log", "monitor/monitor.pid"}
    assert {f"deployments/demo/{name}" for name in written} <= set(modes(isolated_home))
    assert_private(isolated_home)


def test_bench_history_and_the_doctor_report_are_private(isolated_home: Path) -> None:
    history.append({"key": "k", "decode_tps": 1.0})
    write_report("# environment\n", default_report_path())
    assert set(modes(isolated_home)) == {
        ".", "bench", "bench/history.jsonl", "doctor", "doctor/environment.md"
    }  # fmt: skip
    assert_private(isolated_home)


def test_an_older_open_tree_is_tightened_when_used(isolated_home: Path) -> None:
    folder = isolated_home / "deployments" / "demo"
    folder.mkdir(parents=True, mode=0o755)
    for path in (isolated_home, isolated_home / "deployments", folder):
        path.chmod(0o755)
    old_pid = folder / "monitor" / "monitor.pid"
    old_pid.parent.mkdir(mode=0o755)
    old_pid.write_text("")
    old_pid.chmod(0o644)

    MonitorFiles(deployment_dir("demo")).make_dirs()
    assert PidLock(old_pid).acquire()

    assert_private(isolated_home)
