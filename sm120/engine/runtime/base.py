"""The one interface every way of running an engine (native process, container) offers."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sm120.core.bounded import is_regular_file
from sm120.core.defaults import STOP_TIMEOUT_S
from sm120.engine.state import LATEST_TIME, DeploymentState, StateError

# An exit record is a few dozen bytes of JSON.
MAX_RECORD_BYTES = 64 * 1024

if TYPE_CHECKING:
    from sm120.plan.resolve import LaunchPlan


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a runtime needs to start one engine; argv is a list, never a shell string."""

    name: str
    recipe: str
    argv: tuple[str, ...]
    # Added on top of the launcher's own environment, not a replacement for it.
    env: Mapping[str, str]
    host: str
    port: int
    plan_hash: str
    served_model_name: str
    model_dir: str | None
    api_key_file: str | None
    # Docker runtime: the rendered containers.run arguments (sm120.render.container).
    container: Mapping[str, Any] | None = None
    # The engine and its build (the image's engine_version): what protocols it serves.
    engine: str = ""
    engine_version: str = ""
    # A warded engine's unix socket (sm120.plan.ward): the engine listens there only and
    # sm120's ward holds host:port. None: the engine listens on host:port itself.
    engine_socket: str | None = None

    @classmethod
    def for_plan(
        cls,
        plan: LaunchPlan,
        *,
        name: str,
        argv: tuple[str, ...],
        env: Mapping[str, str],
        api_key_file: str,
        container: Mapping[str, Any] | None = None,
        engine_socket: str | None = None,
    ) -> LaunchSpec:
        """The spec that starts `plan` as deployment `name`, natively or in a container: what
        the plan says of itself, and how this runtime runs it."""
        return cls(
            name=name,
            recipe=plan.recipe,
            argv=argv,
            env=env,
            host=plan.host,
            port=plan.port,
            plan_hash=plan.plan_hash,
            served_model_name=plan.model.served_name,
            model_dir=plan.model_dir,
            api_key_file=api_key_file,
            container=container,
            engine=plan.engine,
            engine_version=plan.image.engine_version,
            engine_socket=engine_socket,
        )

    def started(
        self,
        runtime: str,
        started_at: float,
        log_path: Path,
        exit_file: Path,
        supervisor_pid: int,
        supervisor_start: int | None,
        *,
        engine_pid: int | None = None,
        engine_start: int | None = None,
        container_id: str | None = None,
    ) -> DeploymentState:
        """The state a runtime records for what it started from this spec: the spec's fields,
        the supervisor, and the engine (a process, or a container)."""
        return DeploymentState(
            name=self.name,
            recipe=self.recipe,
            runtime=runtime,
            supervisor_pid=supervisor_pid,
            supervisor_start=supervisor_start,
            engine_pid=engine_pid,
            engine_start=engine_start,
            container_id=container_id,
            host=self.host,
            port=self.port,
            plan_hash=self.plan_hash,
            started_at=started_at,
            log_path=str(log_path),
            exit_file=str(exit_file),
            served_model_name=self.served_model_name,
            model_dir=self.model_dir,
            api_key_file=self.api_key_file,
            engine_socket=self.engine_socket,
        )


@dataclass
class ExitInfo:
    returncode: int | None
    signal: int | None
    ended_at: float
    # Which process ended, where one deployment runs several (a multi-node one's
    # "node1:engine"); None for a single engine.
    process: str | None = None

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {signal_name(self.signal)}"
        if self.returncode is not None:
            return f"exited with code {self.returncode}"
        return "ended (exit status unknown)"

    @classmethod
    def read(cls, path: Path) -> ExitInfo | None:
        """Read an exit record written by sm120.engine.runtime.supervise; None if there is none yet.
        Writers replace it atomically, so anything unreadable was damaged: one line says so."""
        if path.exists() and not is_regular_file(path):
            # A FIFO here would block the read forever, /dev/zero would fill memory.
            raise _unusable_record(path, "it is not a regular file")
        try:
            with path.open("rb") as handle:
                raw = handle.read(MAX_RECORD_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _unusable_record(path, exc.strerror or str(exc)) from None
        if len(raw) > MAX_RECORD_BYTES:
            raise _unusable_record(path, f"it is larger than {MAX_RECORD_BYTES} bytes")
        try:
            data = json.loads(raw.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError) as exc:
            raise _unusable_record(path, str(exc)[:120] or type(exc).__name__) from None
        if not isinstance(data, dict):
            raise _unusable_record(path, f"it holds {type(data).__name__}, not a JSON object")
        for key in ("returncode", "signal"):
            value = data.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise _unusable_record(path, f"'{key}' must be an integer or null")
        ended_at = data.get("ended_at", 0.0)
        # Compared as numbers, never converted: NaN fails both bounds, a 400-digit int too.
        if (
            isinstance(ended_at, bool)
            or not isinstance(ended_at, (int, float))
            or not 0 <= ended_at < LATEST_TIME
        ):
            raise _unusable_record(path, "'ended_at' must be a time in seconds since 1970")
        process = data.get("process")
        return cls(
            returncode=data.get("returncode"),
            signal=data.get("signal"),
            ended_at=ended_at,
            process=process if isinstance(process, str) else None,
        )


def _unusable_record(path: Path, problem: str) -> StateError:
    return StateError(
        f"exit record {path} is unusable: {problem}",
        f"delete {path}; status then goes by the processes alone",
    )


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class RuntimeStatus:
    running: bool
    exit: ExitInfo | None
    pid: int | None
    # No end was recorded, yet nothing the state names is ours any more (the machine
    # restarted, or the process was killed with its supervisor): only the state is left.
    stale: bool = False


class Runtime(Protocol):
    # "native" or "docker": how the launcher prepares what the runtime starts.
    kind: str

    def start(self, spec: LaunchSpec, log_path: Path) -> DeploymentState:
        """Start the engine in the background, save and return its state."""
        ...

    def stop(self, state: DeploymentState, timeout: float = STOP_TIMEOUT_S) -> ExitInfo | None:
        """SIGTERM everything the deployment started, SIGKILL what is left after timeout."""
        ...

    def status(self, state: DeploymentState) -> RuntimeStatus: ...

    def exit_info(self, state: DeploymentState) -> ExitInfo | None: ...

    def follow(
        self,
        state: DeploymentState,
        from_line: int = 0,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[str]:
        """Yield log lines (without newline) as written, until stop() or the engine is gone."""
        ...
