"""`sm120 launch NAME --nodes HEAD,WORKER,...`: preflight every node, start in the order the
executor needs, wait for READY through the head, and on any failure stop every node.

native: the headless workers first (they wait at the rendezvous), then rank 0 on the head,
which serves the API once all ranks joined. ray: the Ray head, then the workers join (waited
for until the cluster counts every node), then the engine on the head.

A relaunch (the monitor's, under `--restart on-failure` or a wedge restart) stops every node
and runs the same three steps again - preflight, begin, start - from the saved ClusterStart
(sm120.deploy.cluster_start); it does not wait for READY, the monitor watches for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sm120.core.net import exposure_warning, is_every_interface, is_loopback, reachable_host
from sm120.deploy.checked import CheckedPlan, plan_document

# ClusterRequest is what callers of launch_cluster build: re-exported from here.
from sm120.deploy.cluster_start import ClusterRequest as ClusterRequest
from sm120.deploy.cluster_start import ClusterStart, save_cluster_start

# The single-host launcher's steps, reused as they are (same checks, same READY probe).
from sm120.deploy.launcher import (
    ABANDON_TIMEOUT_S,
    LaunchClock,
    LaunchError,
    LaunchOptions,
    PhaseView,
    Progress,
    Ready,
    engine_python,
    model_ready,
    refuse_or_replace,
    wait_and_smoke,
)
from sm120.deploy.monitoring import prepare_cluster_monitor, start_for
from sm120.deploy.stop import stop_sequence
from sm120.engine.cluster.node import Node, NodeError, StartRequest
from sm120.engine.cluster.nodes import make_nodes
from sm120.engine.cluster.preflight import check, probe_all, probe_requests
from sm120.engine.cluster.record import ClusterRecord, StartedProcess, save_record
from sm120.engine.cluster.runtime import RUNTIME_NAME, ClusterRuntime
from sm120.engine.runtime.processes import start_ticks
from sm120.engine.secrets import ensure_api_key, read_api_key
from sm120.engine.state import (
    DeploymentState,
    clear_state,
    deployment_dir,
    deployment_lock,
    private_dir,
    save_state,
    write_private_atomically,
)
from sm120.measure.target import save_plan
from sm120.plan.resolve import LaunchPlan
from sm120.render.compose import CONTAINER_MODEL_DIR
from sm120.render.multinode import NodeAddress, NodeLaunch, NodeProcess, render_nodes

RAY_WAIT_S = 300.0
RAY_POLL_S = 3.0
# Counts the live nodes of the Ray cluster at argv[1] (run with the engine's Python).
RAY_NODES = (
    "import ray,sys;ray.init(address=sys.argv[1],logging_level='ERROR');"
    "print(sum(1 for n in ray.nodes() if n['Alive']))"
)

NodeMaker = Callable[..., list[Node]]


class RelaunchCancelled(LaunchError):
    """The deployment was stopped while a relaunch was starting it again."""


def never() -> bool:
    return False


@dataclass(frozen=True)
class PreparedStart:
    """What preflight settled: the plan with the fabric interface, and each node's part."""

    plan: LaunchPlan
    nodes: list[Node]
    launches: list[NodeLaunch]
    api_host: str


@dataclass(frozen=True)
class StartStep:
    rank: int
    process: NodeProcess
    # After this start, wait until the Ray cluster counts this many live nodes (0: no wait).
    ray_nodes: int = 0


def start_steps(launches: Sequence[NodeLaunch], executor: str) -> list[StartStep]:
    """The order processes start in, across nodes."""
    head, workers = launches[0], launches[1:]
    if executor == "native":
        return [*(StartStep(w.rank, w.main) for w in workers), StartStep(0, head.main)]
    steps = [StartStep(0, head.processes[0], ray_nodes=1)]
    steps += [StartStep(w.rank, w.main) for w in workers]
    steps[-1] = dataclasses.replace(steps[-1], ray_nodes=len(launches))
    steps.append(StartStep(0, head.main))
    return steps


def launch_cluster(
    checked: CheckedPlan,
    request: ClusterRequest,
    options: LaunchOptions,
    progress: Progress,
    view: PhaseView,
    *,
    make: NodeMaker = make_nodes,
) -> Ready:
    checked.raise_on_failure()
    # Before anything is written, as for one node (sm120.deploy.launcher.launch).
    with deployment_lock(options.name, "launch"):
        return _launch_cluster_locked(checked, request, options, progress, view, make)


def _launch_cluster_locked(
    checked: CheckedPlan,
    request: ClusterRequest,
    options: LaunchOptions,
    progress: Progress,
    view: PhaseView,
    make: NodeMaker,
) -> Ready:
    clock = LaunchClock(options.started_at)
    runtime = ClusterRuntime()
    refuse_or_replace(options, progress)
    python = _node_python(checked.plan, options, request.runtime, progress)
    prepared = preflight_nodes(checked.plan, request, python, progress, make)
    start = ClusterStart(
        name=options.name,
        plan=checked.plan,
        request=request,
        python=python,
        key_file=str(ensure_api_key(options.name, options.api_key)),
        # One budget for the whole start: forming a Ray cluster counts against it too.
        budget_s=options.timeout_s or checked.plan.timeouts.ready_s,
    )
    state, record = begin(start, prepared, runtime, fresh_log=True)
    # bench and gates read the plan (image, baseline, limits) from the state dir.
    save_plan(options.name, plan_document(checked))
    try:
        start_processes(start, prepared, record, state, progress)
        progress(f"all {len(prepared.nodes)} nodes started; waiting for the head to serve")
        clock.mark("preflight and start on every node")
        ready = wait_and_smoke(checked, runtime, state, options, view, clock)
    except BaseException:
        progress("stopping every node")
        abandon_start(state, runtime)
        raise
    # What the monitor relaunches from (--restart on-failure, wedge restarts); kept without
    # one too, for a monitor started by hand (`sm120 monitor --serve`).
    save_cluster_start(start)
    if options.monitor:
        prepare_cluster_monitor(prepared.plan, options.name, request.runtime)
        ready.monitor_pid = start_for(options.name)
    return ready


def abandon_start(state: DeploymentState, runtime: ClusterRuntime) -> None:
    """A launch that failed stops through the one stop sequence, as on one host. A node that
    cannot be reached is not reported (its error would hide the one that ended the launch),
    and the state goes all the same."""
    try:
        stop_sequence(state, runtime=runtime, timeout=ABANDON_TIMEOUT_S, lock_held=True)
    except NodeError:
        clear_state(state.name)


def relaunch_cluster(
    start: ClusterStart,
    state: DeploymentState,
    progress: Progress,
    *,
    stop_timeout_s: float = 30.0,
    cancelled: Callable[[], bool] = never,
    make: NodeMaker = make_nodes,
) -> DeploymentState:
    """Stop every node, then preflight and start them all again, in order; the new state.
    The caller holds the deployment's lock. A failure (or `cancelled()`, checked between the
    steps) stops whatever this relaunch started before it raises; the state saved by then
    stays, so `status` shows the deployment as down, not gone."""
    runtime = ClusterRuntime()
    _go_on(cancelled)
    progress(f"stopping every node of {state.name}")
    runtime.stop(state, timeout=stop_timeout_s)
    _go_on(cancelled)
    prepared = preflight_nodes(start.plan, start.request, start.python, progress, make)
    _go_on(cancelled)
    new_state, record = begin(start, prepared, runtime, fresh_log=False)
    try:
        start_processes(start, prepared, record, new_state, progress, cancelled=cancelled)
    except BaseException:
        progress("stopping every node")
        with contextlib.suppress(NodeError):
            runtime.stop(new_state, timeout=10.0)
        raise
    progress(f"all {len(prepared.nodes)} nodes started again")
    return new_state


def _go_on(cancelled: Callable[[], bool]) -> None:
    if cancelled():
        raise RelaunchCancelled(
            "the deployment was stopped during its relaunch", "nothing of it is left running"
        )


def preflight_nodes(
    plan: LaunchPlan, request: ClusterRequest, python: str, progress: Progress, make: NodeMaker
) -> PreparedStart:
    """Probe every node and compare; render what runs where. Nothing starts here."""
    assert plan.multinode is not None
    nodes = make(
        request.nodes, runtime=request.runtime, python=python, ssh_options=request.ssh_options
    )
    docker = request.runtime == "docker"
    progress(f"preflight: probing {len(nodes)} nodes")
    requests = probe_requests(
        plan, len(nodes), image=plan.image_ref, model_dir=plan.model_dir, api_bind=plan.host
    )
    facts = check(plan, probe_all(nodes, request.nodes, requests), docker=docker)
    api_host = reachable_api_host(plan.host, facts.addresses[0])
    exposure = exposure_warning(plan.host)
    if exposure:
        progress(f"warning: {exposure}")
    layout = plan.multinode.model_copy(update={"socket_ifname": facts.ifname})
    plan = dataclasses.replace(plan, multinode=layout)
    launches = render_nodes(
        plan,
        facts.addresses,
        python=None if docker else python,
        container_model_dir=CONTAINER_MODEL_DIR if docker and plan.model_dir else None,
    )
    return PreparedStart(plan, nodes, launches, api_host)


def _node_python(plan: LaunchPlan, options: LaunchOptions, runtime: str, progress: Progress) -> str:
    if runtime == "docker":
        return plan.image.python
    if plan.model.generated == "tiny":
        python = engine_python(plan, options, progress)  # resolved (or built) here
        model_ready(plan, python, progress)
        return python
    if plan.pending:
        raise LaunchError(
            f"cannot derive what the plan needs: {plan.pending[0]}",
            "pass --model-dir with the downloaded checkpoint",
        )
    chosen = options.vllm_python or os.environ.get("VLLM_PYTHON")
    if not chosen:
        raise LaunchError(
            "nodes reached over SSH run the engine's own Python, and none is named",
            "--vllm-python PATH (the same path on every node), or --runtime docker",
        )
    return chosen


def reachable_api_host(bind: str, head: NodeAddress) -> str:
    """Where this machine reaches the head's API server: as for one host (core.net), except
    that every interface of the head is reached at the head's address, and its loopback only
    when the head is this machine."""
    if is_every_interface(bind):
        return head.address
    if is_loopback(bind) and not _is_local(head.address):
        raise LaunchError(
            f"the API would listen on {bind} of {head.host}, which this machine cannot reach",
            f"--host {head.address} (or run sm120 on the head)",
        )
    return reachable_host(bind)


def _is_local(address: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def begin(
    start: ClusterStart, prepared: PreparedStart, runtime: ClusterRuntime, *, fresh_log: bool
) -> tuple[DeploymentState, ClusterRecord]:
    """Record the deployment and start its log aggregator before the first node starts. A
    relaunch keeps serve.log: the runs follow each other in it, as on one host."""
    plan, name = prepared.plan, start.name
    folder = deployment_dir(name)
    log_path = folder / "logs" / "serve.log"
    private_dir(log_path.parent)
    if fresh_log or not log_path.exists():
        write_private_atomically(log_path, "")
    record = ClusterRecord(
        run_id=f"{name}-{secrets.token_hex(4)}", nodes=[n.describe() for n in prepared.nodes]
    )
    save_record(name, record)
    aggregator = runtime.start_aggregator(name)
    state = DeploymentState(
        name=name,
        recipe=plan.recipe,
        runtime=RUNTIME_NAME,
        supervisor_pid=aggregator,
        supervisor_start=start_ticks(aggregator),
        engine_pid=None,
        host=prepared.api_host,
        port=plan.port,
        plan_hash=plan.plan_hash,
        started_at=time.time(),
        log_path=str(log_path),
        exit_file=str(folder / "exit.json"),
        served_model_name=plan.model.served_name,
        model_dir=plan.model_dir,
        api_key_file=start.key_file,
    )
    save_state(state)
    return state, record


def start_processes(
    start: ClusterStart,
    prepared: PreparedStart,
    record: ClusterRecord,
    state: DeploymentState,
    progress: Progress,
    *,
    cancelled: Callable[[], bool] = never,
) -> None:
    """Every process of every node, in start order; each recorded as soon as it started, so
    a stop (even of a launcher killed half-way) finds it."""
    plan, nodes, launches = prepared.plan, prepared.nodes, prepared.launches
    assert plan.multinode is not None
    docker = start.request.runtime == "docker"
    key = read_api_key(start.key_file)
    for step in start_steps(launches, plan.multinode.executor):
        _go_on(cancelled)
        launch = launches[step.rank]
        env = launch.env_for(step.process)
        if step.process.serves_api and key:
            env["VLLM_API_KEY"] = key  # travels on stdin / the Docker API, never argv
        progress(f"starting {step.process.name} on {nodes[step.rank].label}")
        handle = nodes[step.rank].start(
            StartRequest(
                deployment=state.name,
                run_id=record.run_id,
                rank=step.rank,
                name=step.process.name,
                argv=step.process.argv,
                env=env,
                image=launch.image,
                gpus=launch.gpus,
                model_dir=plan.model_dir if docker else None,
                container_model_dir=CONTAINER_MODEL_DIR if docker else None,
                shm_size=plan.image.shm_size,
                labels={"sm120.recipe": plan.recipe, "sm120.plan-hash": plan.plan_hash},
            )
        )
        record.processes.append(StartedProcess(step.rank, step.process.name, handle))
        save_record(state.name, record)
        if step.ray_nodes:
            head = launches[0]
            ray_head = next(p for p in record.processes if p.rank == 0 and p.name != "engine")
            address = f"{head.address}:{plan.multinode.ray_port}"
            progress(f"waiting for {step.ray_nodes} nodes in the Ray cluster at {address}")
            wait_for_ray(
                nodes[0],
                ray_head.handle,
                head.main.argv[0],
                address,
                step.ray_nodes,
                timeout=min(start.budget_s, RAY_WAIT_S),
                cancelled=cancelled,
            )


def wait_for_ray(
    head: Node,
    handle: str,
    python: str,
    address: str,
    expected: int,
    *,
    timeout: float = RAY_WAIT_S,
    poll: float = RAY_POLL_S,
    cancelled: Callable[[], bool] = never,
) -> None:
    deadline = time.monotonic() + timeout
    alive = 0
    while True:
        _go_on(cancelled)
        if not head.status(handle).running:
            raise LaunchError(
                f"{head.label}: the Ray head ended before the cluster formed",
                "its output is in the deployment log (sm120 logs)",
            )
        code, output = head.run(handle, [python, "-c", RAY_NODES, address], timeout=60.0)
        lines = output.strip().splitlines()
        if code == 0 and lines and lines[-1].strip().isdigit():
            alive = int(lines[-1].strip())
            if alive >= expected:
                return
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"the Ray cluster at {address} has {alive} of {expected} nodes after "
                f"{timeout:.0f} s",
                "the workers must reach the head's Ray port over the fabric (sm120 logs)",
            )
        time.sleep(poll)
