"""Which model is served by which deployment, read from sm120's own state files each time it
is asked (deployments come and go while the gateway runs).

A deployment counts when it runs now (its state file) or when it could be started again by
the gateway (the launch spec its launch saved, sm120.monitor.files): a stopped deployment
keeps that spec, so the gateway can bring it back for a request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sm120.core.net import client_url
from sm120.deploy.monitoring import monitor_files
from sm120.engine.find import runtime_for
from sm120.engine.runtime.base import LaunchSpec
from sm120.engine.secrets import key_path, read_api_key
from sm120.engine.state import (
    StateError,
    deployment_path,
    deployments_root,
    is_deployment_name,
    load_state,
)
from sm120.gateway.absorb import fixes_for
from sm120.monitor.files import load_launch_spec
from sm120.recipe.endpoints import EngineProtocols, engine_protocols

SLEEP_MODE_FLAG = "--enable-sleep-mode"
AUTO_TOOL_FLAG = "--enable-auto-tool-choice"


@dataclass(frozen=True)
class Backend:
    model: str
    deployment: str
    # Where clients of the deployment would go (http://host:port): shown, and how a backend
    # without a socket is reached; its authority is the Host header an engine gets.
    base_url: str
    api_key: str | None = field(repr=False)
    running: bool
    # The gateway can start it (a launch spec was saved when it was launched).
    startable: bool
    # Started with --enable-sleep-mode: it can sleep and wake instead of stop and start.
    sleep_mode: bool
    # What its engine build serves (sm120/data/endpoints.yaml); None: not known.
    protocols: EngineProtocols | None = None
    # From its launch command, for the clients `sm120 connect` configures; None: not known.
    max_model_len: int | None = None
    # Started with --enable-auto-tool-choice: agents' `tool_choice: auto` requests work.
    auto_tool_choice: bool | None = None
    # From its launch command: how many sequences it runs at once (the gateway's turns).
    max_num_seqs: int | None = None
    # The engine bugs the gateway absorbs for this build (sm120/data/engine_fixes.yaml);
    # empty for most: those requests keep the fast path as they are.
    fixes: frozenset[str] = frozenset()
    # A warded deployment's engine listens only on this unix socket (in a 0700 folder: only
    # sm120 reaches it; DeploymentState.engine_socket), and its TCP port is the ward's. The
    # gateway goes to the socket itself: no second hop, and the swap routes the ward does
    # not pass (/sleep, /wake_up, /is_sleeping) stay the gateway's. None: base_url.
    socket: str | None = None


def discover(skipped: dict[str, str] | None = None) -> dict[str, Backend]:
    """Every model a deployment serves or could serve again, keyed by the model name. When
    two deployments serve one name, a running one wins, then the first by name. A deployment
    whose files cannot be read is left out (named in `skipped` with the reason): one broken
    folder must not take the healthy ones down with it."""
    root = deployments_root()
    found: dict[str, Backend] = {}
    if not root.is_dir():
        return found
    for folder in sorted(root.iterdir()):
        try:
            backend = _backend(folder)
        except Exception as exc:  # any defect in one folder stays in that folder
            if skipped is not None:
                skipped[folder.name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        if backend is None:
            continue
        current = found.get(backend.model)
        if current is None or (backend.running and not current.running):
            found[backend.model] = backend
    return found


def _backend(folder: Path) -> Backend | None:
    name = folder.name
    if not folder.is_dir() or not is_deployment_name(name):
        return None
    deployment_path(name)  # a folder linked out of the state tree is named, never read
    try:
        state = load_state(name)
    except StateError:
        # An unusable state file is `sm120 status`'s to report; the gateway leaves it alone.
        return None
    key = read_api_key(state.api_key_file if state else str(key_path(name)))
    spec = load_launch_spec(monitor_files(name).launch_spec, key)
    # A deployment that runs is served where its state says; one that does not, where its
    # launch spec would start it.
    served = state if state is not None else spec
    if served is None:
        return None
    return Backend(
        model=served.served_model_name,
        deployment=name,
        base_url=client_url(served.host, served.port),
        api_key=key,
        running=state is not None and runtime_for(state).status(state).running,
        startable=spec is not None,
        sleep_mode=_sleeps(spec),
        protocols=_protocols(spec),
        max_model_len=_int_flag(spec, "--max-model-len"),
        auto_tool_choice=None if spec is None else AUTO_TOOL_FLAG in spec.argv,
        max_num_seqs=_int_flag(spec, "--max-num-seqs"),
        fixes=_fixes(spec),
        # Only a running engine has one: a stopped one's is known once it is started again.
        socket=state.engine_socket if state is not None else None,
    )


def _int_flag(spec: LaunchSpec | None, flag: str) -> int | None:
    if spec is None or flag not in spec.argv:
        return None
    index = spec.argv.index(flag)
    try:
        return int(spec.argv[index + 1])
    except (IndexError, ValueError):
        return None


def _protocols(spec: LaunchSpec | None) -> EngineProtocols | None:
    if spec is None or not spec.engine:
        return None
    return engine_protocols(spec.engine, spec.engine_version)


def _fixes(spec: LaunchSpec | None) -> frozenset[str]:
    if spec is None or not spec.engine:
        return frozenset()
    return fixes_for(spec.engine, spec.engine_version, spec.env)


def _sleeps(spec: LaunchSpec | None) -> bool:
    return spec is not None and SLEEP_MODE_FLAG in spec.argv
