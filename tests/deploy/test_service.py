"""`sm120 service`: unit renders (golden), systemd's own verifier, install/uninstall into a
temporary XDG_CONFIG_HOME, and every refusal with its exact message.

Refresh the golden units after an intended change with:
pytest tests/deploy/test_service.py --update-golden
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.deploy.notify import notify
from sm120.deploy.service import (
    MARKER,
    ServiceError,
    ServiceRequest,
    render_unit,
    systemd_quote,
)
from tests.helpers import GOLDEN_DIR, invoke

GOLDEN = GOLDEN_DIR / "service"
NATIVE = ServiceRequest(
    deployment="tiny",
    recipe="tiny",
    variants=(),
    executable=("/opt/sm120/.venv/bin/python", "-m", "sm120"),
    launch_args=("--port", "8011"),
    runtime="native",
    ready_timeout_s=600,
    home="/home/user/.local/state/sm120",
    working_dir="/home/user/serve",
)
CASES = {
    "native-user": NATIVE,
    "docker-system": replace(
        NATIVE,
        deployment="glm",
        recipe="glm52",
        variants=("dcp2",),
        launch_args=("-V", "dcp2", "--runtime", "docker", "--name", "glm"),
        runtime="docker",
        ready_timeout_s=5400,
        home="/root/.local/state/sm120",
        system=True,
    ),
    "docker-user": replace(NATIVE, launch_args=("--runtime", "docker"), runtime="docker"),
    "env-file": replace(
        NATIVE,
        launch_args=("--env-file", "my env/.env", "--set", "max-model-len=4096"),
        env_file="/home/user/serve/my env/.env",
        working_dir="/home/user/my serve",
        home="/home/user/state $x 50%",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_unit(case: str, request: pytest.FixtureRequest) -> None:
    path = GOLDEN / f"{case}.service"
    actual = render_unit(CASES[case])
    if request.config.getoption("--update-golden"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.is_file(), f"missing {path.name}: run pytest --update-golden"
    assert actual == path.read_text(), f"{path.name} changed: review, then --update-golden"


def test_docker_units_order_after_docker_and_system_ones_require_it() -> None:
    system = render_unit(CASES["docker-system"])
    user = render_unit(CASES["docker-user"])
    assert "After=network-online.target docker.service\n" in system
    assert "Requires=docker.service\n" in system
    # A user manager has no docker.service to require (systemd-analyze says so).
    assert "After=network-online.target docker.service\n" in user
    assert "Requires=" not in user
    assert "docker" not in render_unit(NATIVE)


def test_timeouts_cover_the_ready_wait_and_the_stop() -> None:
    text = render_unit(replace(NATIVE, ready_timeout_s=1234))
    assert "TimeoutStartSec=1534\n" in text  # ready_s + 300
    assert "TimeoutStopSec=60\n" in text  # sm120's 30 s SIGTERM-then-SIGKILL + 30
    assert "StartLimitIntervalSec=4632\n" in text  # 3 starts of (1534 + 10 s) each
    assert "KillMode=mixed\n" in text


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("--port", "--port"),
        ("my env/.env", '"my env/.env"'),
        ("50%", "50%%"),
        ("$HOME", "$$HOME"),
        ('say "hi"', '"say \\"hi\\""'),
        ("a\\b", '"a\\\\b"'),
        ("", '""'),
    ],
)
def test_exec_start_words_are_escaped_for_systemd(arg: str, quoted: str) -> None:
    assert systemd_quote(arg) == quoted


def test_a_control_character_is_refused() -> None:
    with pytest.raises(ServiceError, match="has a control character"):
        systemd_quote("a\nb")


def _verify(text: str, tmp_path: Path, system: bool) -> subprocess.CompletedProcess[str]:
    unit = tmp_path / "sm120-verify.service"
    unit.write_text(text)
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    scope = [] if system else ["--user"]
    return subprocess.run(
        ["systemd-analyze", *scope, "verify", str(unit)],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir)},
        check=False,
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("case", sorted(CASES))
def test_systemd_analyze_verifies_the_unit(case: str, tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this interpreter.
    # It also checks WorkingDirectory exists: a real one, spaces and all.
    folder = tmp_path / "my serve"
    folder.mkdir()
    request = replace(
        CASES[case],
        executable=(sys.executable, "-m", "sm120"),
        working_dir=str(folder),
        home=str(tmp_path / "state $HOME 50%"),
    )
    done = _verify(render_unit(request), tmp_path, request.system)
    assert done.returncode == 0, done.stderr
    # It only warns (rc 0) about a setting it ignores: none may be ignored.
    assert done.stderr.strip() == "", done.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_the_verifier_catches_a_broken_unit(tmp_path: Path) -> None:
    broken = render_unit(NATIVE).replace("KillMode=mixed", "KillMode=sometimes")
    assert "Failed to parse kill mode" in _verify(broken, tmp_path, system=True).stderr


def test_print_renders_the_launch_for_this_folder(cli: CliRunner, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("# the settings launch reads\n")
    code, out, err = invoke(cli, "service", "print", "tiny", "--port", "8011")
    assert (code, err) == (0, "")
    assert out.startswith(MARKER + "\n[Unit]\nDescription=sm120 deployment tiny: recipe tiny\n")
    assert (
        f"ExecStart={sys.executable} -m sm120 launch tiny --port 8011 --foreground --yes\n" in out
    )
    assert f"WorkingDirectory={tmp_path}\n" in out
    assert f"EnvironmentFile=-{tmp_path / '.env'}\n" in out
    assert f"Environment=SM120_HOME={tmp_path / 'sm120-home'}\n" in out
    assert "TimeoutStartSec=" in out and "WantedBy=default.target\n" in out


def test_print_names_the_variant_and_the_deployment(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "service", "print", "glm52", "-V", "dcp2", "--name", "g2")
    assert code == 0
    assert "Description=sm120 deployment g2: recipe glm52 (variant dcp2)\n" in out


def test_install_and_uninstall_a_user_unit(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    unit = tmp_path / "config" / "systemd" / "user" / "sm120-tiny.service"
    code, out, _ = invoke(cli, "service", "install", "tiny", "--dry-run")
    assert code == 0 and out.startswith(f"would write {unit}:\n{MARKER}\n")
    assert not unit.exists()
    code, out, _ = invoke(cli, "service", "install", "tiny", "--port", "8011")
    assert code == 0
    assert out == (
        f"wrote {unit}\nstart it: systemctl --user daemon-reload && "
        "systemctl --user enable --now sm120-tiny.service\n"
    )
    assert unit.stat().st_mode & 0o777 == 0o644
    assert " launch tiny --port 8011 --foreground --yes\n" in unit.read_text()
    # Ours: a second install rewrites it.
    assert invoke(cli, "service", "install", "tiny", "--port", "8012")[0] == 0
    assert " --port 8012 " in unit.read_text()
    code, out, _ = invoke(cli, "service", "uninstall", "tiny", "--dry-run")
    assert out == (
        f"would remove {unit} (stop and disable it first: systemctl --user disable --now "
        "sm120-tiny.service)\n"
    )
    assert unit.exists()
    code, out, _ = invoke(cli, "service", "uninstall", "tiny")
    assert (code, out) == (0, f"removed {unit}; now run: systemctl --user daemon-reload\n")
    assert not unit.exists()


def _refused(runner: CliRunner, *args: str) -> str:
    code, out, err = invoke(runner, *args)
    assert (code, out) == (2, ""), err
    return err


def test_an_enabled_unit_is_not_removed(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert invoke(cli, "service", "install", "tiny")[0] == 0
    user = tmp_path / "config" / "systemd" / "user"
    (user / "default.target.wants").mkdir()
    (user / "default.target.wants" / "sm120-tiny.service").symlink_to(user / "sm120-tiny.service")
    assert _refused(cli, "service", "uninstall", "tiny") == (
        "Error: sm120-tiny.service is still enabled (hint: run 'systemctl --user disable "
        "--now sm120-tiny.service' first)\n"
    )
    assert (user / "sm120-tiny.service").exists()


def test_a_foreign_unit_is_neither_overwritten_nor_removed(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    unit = tmp_path / "config" / "systemd" / "user" / "sm120-tiny.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    message = (
        f"Error: {unit} exists and sm120 did not write it; not {{}} it (hint: remove or rename "
        "it yourself, or serve under another --name)\n"
    )
    assert _refused(cli, "service", "install", "tiny") == message.format("overwriting")
    assert _refused(cli, "service", "uninstall", "tiny") == message.format("removing")
    assert unit.read_text() == "[Service]\nExecStart=/bin/true\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("print", "tiyn"),
            "Error: unknown recipe 'tiyn'; did you mean 'tiny'? (hint: run 'sm120 recipes' to "
            "list them)",
        ),
        (
            ("print", "tiny", "--dry-run"),
            "Error: --dry-run cannot be carried by a service: a service serves; 'sm120 launch "
            "NAME --dry-run' prints the plan (hint: leave it out of 'sm120 service')",
        ),
        (
            ("install", "tiny", "--api-key=s3cret"),
            "Error: --api-key cannot be carried by a service: a unit file is world-readable; "
            "leave it out and the key is generated 0600 (hint: leave it out of 'sm120 service')",
        ),
        (
            ("print", "tiny", "--bogus"),
            "Error: not a launch option: No such option: --bogus (hint: see 'sm120 launch --help')",
        ),
        (
            ("print", "tiny", "--name", "a/b"),
            "Error: invalid deployment name 'a/b' (hint: use letters, digits, '.', '_' or '-', "
            "starting with a letter or digit)",
        ),
        (
            ("print", "tiny", "--runtime", "dokcer"),
            "Error: unknown runtime 'dokcer'; did you mean 'docker'? (hint: use --runtime "
            "native or --runtime docker)",
        ),
        (
            ("uninstall", "tiny"),
            "Error: no unit at {config}/systemd/user/sm120-tiny.service (hint: see 'sm120 "
            "service print NAME' for its name)",
        ),
    ],
)
def test_bad_input_is_one_line(
    args: tuple[str, ...],
    message: str,
    cli: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    err = _refused(cli, "service", *args)
    assert err == message.format(config=tmp_path / "config") + "\n"


def test_an_unknown_variant_is_refused(cli: CliRunner) -> None:
    assert _refused(cli, "service", "print", "tiny", "-V", "nope") == (
        "Error: recipe 'tiny' has no variant 'nope'; did you mean '2node'? (hint: variants: "
        "2node, agent, gpu)\n"
    )


def test_a_system_install_needs_root(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert _refused(cli, "service", "install", "tiny", "--system") == (
        "Error: writing to /etc/systemd/system needs root (hint: run it with sudo, or drop "
        "--system for a user unit)\n"
    )


def test_notify_sends_ready_to_the_service_manager(tmp_path: Path) -> None:
    address = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(address))
        assert notify("READY=1", {"NOTIFY_SOCKET": str(address)})
        assert server.recv(100) == b"READY=1"
    assert not notify("READY=1", {})


def test_now_without_systemctl_says_what_to_run(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, out, err = invoke(cli, "service", "install", "tiny", "--now")
    assert (code, out.splitlines()[0]) == (
        2,
        f"wrote {tmp_path}/config/systemd/user/sm120-tiny.service",
    )
    assert err == (
        "Error: systemctl not found (hint: run yourself: systemctl --user daemon-reload && "
        "systemctl --user enable --now sm120-tiny.service)\n"
    )
    assert (tmp_path / "config" / "systemd" / "user" / "sm120-tiny.service").is_file()
