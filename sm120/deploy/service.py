"""`sm120 service`: a systemd unit that runs one deployment as `sm120 launch ... --foreground`.

The unit's process is the foreground launcher, so the engine's life is the service's: READY
is reported to systemd (Type=notify), an engine that dies ends the launcher non-zero
(Restart=on-failure brings it back, the start limit is the circuit breaker), and SIGTERM from
`systemctl stop` runs sm120's own stop sequence. With `--restart on-failure` among the launch
options, sm120's monitor relaunches a dead engine inside the running service (the launcher
follows the deployment through it), and when its breaker gives up the launcher exits
EXIT_GAVE_UP, which RestartPreventExitStatus keeps systemd from restarting. KillMode=mixed
sends that SIGTERM to the launcher only and SIGKILLs whatever is left after TimeoutStopSec.

render_unit is pure (request -> text); install/uninstall are the only file writes, and
they touch only units that carry MARKER, i.e. that sm120 wrote.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sm120.core.defaults import STOP_TIMEOUT_S
from sm120.core.errors import SM120Error
from sm120.deploy.foreground import EXIT_GAVE_UP
from sm120.engine.state import check_deployment_name

MARKER = "# Written by sm120 (sm120 service install); 'sm120 service uninstall' removes it."
SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
# Past the recipe's ready timeout: checks, the engine's own start and the READY probe.
START_MARGIN_S = 300
# Past sm120's SIGTERM-then-SIGKILL stop of the engine: the monitor and state cleanup.
STOP_MARGIN_S = 30
RESTART_SEC = 10
# The circuit breaker: this many failed starts within the time they can take, then stop.
START_LIMIT_BURST = 3

# Launch options a service cannot carry, with why (the flag as the user typed it).
UNCARRIED = {
    "--dry-run": "a service serves; 'sm120 launch NAME --dry-run' prints the plan",
    "--json": "it only shapes --dry-run output",
    "--api-key": "a unit file is world-readable; leave it out and the key is generated 0600",
    "--replace": "the service owns the deployment; stop the running one first",
}


class ServiceError(SM120Error):
    """A unit that cannot be rendered, written or removed."""


@dataclass(frozen=True)
class ServiceRequest:
    """Everything the unit says, resolved beforehand (render_unit does no I/O)."""

    deployment: str
    recipe: str
    variants: tuple[str, ...]
    # argv of the sm120 command itself, by absolute path (e.g. python -m sm120).
    executable: tuple[str, ...]
    # Launch arguments after NAME, as given (without --foreground, which the unit adds).
    launch_args: tuple[str, ...]
    runtime: str
    ready_timeout_s: float
    home: str
    working_dir: str
    env_file: str | None = None
    system: bool = False


def unit_name(deployment: str) -> str:
    return f"sm120-{check_deployment_name(deployment)}.service"


def unit_dir(system: bool, environ: dict[str, str] | None = None) -> Path:
    if system:
        return SYSTEM_UNIT_DIR
    env = os.environ if environ is None else environ
    config = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "systemd" / "user"


def refuse_uncarried(flags: list[str]) -> None:
    for flag in flags:
        if flag in UNCARRIED:
            raise ServiceError(
                f"{flag} cannot be carried by a service: {UNCARRIED[flag]}",
                "leave it out of 'sm120 service'",
            )


def systemd_quote(arg: str, *, expands_variables: bool = True) -> str:
    """One ExecStart word (or Environment= assignment): systemd splits on spaces, expands
    % specifiers (and $VARIABLES in ExecStart), and runs no shell."""
    _refuse_control(arg)
    escaped = arg.replace("%", "%%")
    if expands_variables:
        escaped = escaped.replace("$", "$$")
    if escaped and not any(char in escaped for char in " \t\"'\\;"):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _path_value(path: str) -> str:
    """WorkingDirectory=/EnvironmentFile= take the rest of the line as is: no quoting,
    only specifiers are expanded."""
    _refuse_control(path)
    return path.replace("%", "%%")


def _refuse_control(text: str) -> None:
    if any(ord(char) < 32 or ord(char) == 127 for char in text):
        raise ServiceError(
            f"argument {text!r} has a control character", "pass plain text to the service"
        )


def exec_start(request: ServiceRequest) -> list[str]:
    return [
        *request.executable,
        "launch",
        request.recipe,
        *request.launch_args,
        "--foreground",
        # A service has no terminal to ask on; installing it agreed to the long one-off work
        # (the engine's install, the image's build), which a launch refuses unasked otherwise.
        "--yes",
    ]


def timeouts(request: ServiceRequest) -> tuple[int, int]:
    """(TimeoutStartSec, TimeoutStopSec)."""
    return int(request.ready_timeout_s) + START_MARGIN_S, int(STOP_TIMEOUT_S) + STOP_MARGIN_S


def render_unit(request: ServiceRequest) -> str:
    start_s, stop_s = timeouts(request)
    variants = f" (variant {', '.join(request.variants)})" if request.variants else ""
    after = ["network-online.target"]
    requires: list[str] = []
    if request.runtime == "docker":
        after.append("docker.service")
        # A user manager cannot require a system unit; it can only order after it.
        if request.system:
            requires.append("docker.service")
    unit = [
        MARKER,
        "[Unit]",
        f"Description=sm120 deployment {request.deployment}: recipe {request.recipe}{variants}",
        f"After={' '.join(after)}",
        "Wants=network-online.target",
        *(f"Requires={name}" for name in requires),
        f"StartLimitIntervalSec={START_LIMIT_BURST * (start_s + RESTART_SEC)}",
        f"StartLimitBurst={START_LIMIT_BURST}",
        "",
        "[Service]",
        # READY=1 is sent by the launcher once the smoke test passed.
        "Type=notify",
        f"ExecStart={' '.join(systemd_quote(arg) for arg in exec_start(request))}",
        f"WorkingDirectory={_path_value(request.working_dir)}",
        f"Environment={systemd_quote('SM120_HOME=' + request.home, expands_variables=False)}",
        "Environment=PYTHONUNBUFFERED=1",
    ]
    if request.env_file:
        # "-": a missing file is not an error (launch then runs without it).
        unit.append(f"EnvironmentFile=-{_path_value(request.env_file)}")
    unit += [
        "Restart=on-failure",
        f"RestartSec={RESTART_SEC}",
        f"TimeoutStartSec={start_s}",
        f"TimeoutStopSec={stop_s}",
        "KillMode=mixed",
        # 130: interrupted before READY by a stop request; that is not a failure to restart.
        "SuccessExitStatus=130",
        # sm120's own breaker (`--restart on-failure`) gave up: systemd must not undo that.
        f"RestartPreventExitStatus={EXIT_GAVE_UP}",
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if request.system else 'default.target'}",
        "",
    ]
    return "\n".join(unit)


def systemctl_commands(deployment: str, system: bool) -> list[str]:
    scope = "" if system else " --user"
    return [
        f"systemctl{scope} daemon-reload",
        f"systemctl{scope} enable --now {unit_name(deployment)}",
    ]


def disable_command(deployment: str, system: bool) -> str:
    scope = "" if system else " --user"
    return f"systemctl{scope} disable --now {unit_name(deployment)}"


def is_ours(path: Path) -> bool:
    try:
        return path.read_text(encoding="utf-8").startswith(MARKER)
    except (OSError, UnicodeDecodeError):
        return False


def _refuse_foreign(path: Path, doing: str) -> None:
    if path.exists() and not is_ours(path):
        raise ServiceError(
            f"{path} exists and sm120 did not write it; not {doing} it",
            "remove or rename it yourself, or serve under another --name",
        )


def check_system_install(system: bool, euid: int) -> None:
    if system and euid != 0:
        raise ServiceError(
            f"writing to {SYSTEM_UNIT_DIR} needs root",
            "run it with sudo, or drop --system for a user unit",
        )


def install_unit(path: Path, text: str) -> None:
    _refuse_foreign(path, "overwriting")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(0o644)
    tmp.replace(path)


def enabled_links(path: Path) -> list[Path]:
    """The `systemctl enable` symlinks to the unit (in its directory's *.wants folders)."""
    return sorted(path.parent.glob(f"*.wants/{path.name}"))


def uninstall_unit(path: Path, disable: str) -> None:
    if not path.exists():
        raise ServiceError(f"no unit at {path}", "see 'sm120 service print NAME' for its name")
    _refuse_foreign(path, "removing")
    if enabled_links(path):
        raise ServiceError(f"{path.name} is still enabled", f"run '{disable}' first")
    path.unlink()
