"""Hooking the monitor into the lifecycle: launch hands it its settings and starts it after
READY; stop and --replace end it before they touch the server."""

from __future__ import annotations

from sm120.core.errors import SM120Error
from sm120.deploy.cluster_start import cluster_start_path
from sm120.engine.runtime.base import LaunchSpec
from sm120.engine.state import deployment_dir
from sm120.monitor.files import MonitorFiles, MonitorSettings, save_launch_spec
from sm120.monitor.process import MONITOR_MODULE, start_monitor, stop_monitor
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.restart_policy import parse_restart_policy

# `python -m` this to run the monitor of a deployment over several nodes.
CLUSTER_MONITOR_MODULE = "sm120.deploy.cluster_monitor"


class SupervisionError(SM120Error):
    """A restart policy that nothing would carry out."""


def check_restart_policy(plan: LaunchPlan, *, monitor: bool) -> None:
    """Refuse a relaunch promise this launch cannot keep, before anything starts."""
    policy = parse_restart_policy(plan.monitor.restart)
    if policy.on_failure and not monitor:
        raise SupervisionError(
            f"restart policy {policy} needs the monitor, which --no-monitor turns off",
            "drop --no-monitor, or launch with --restart no",
        )


def monitor_files(name: str) -> MonitorFiles:
    return MonitorFiles(deployment_dir(name))


def settings_from_plan(plan: LaunchPlan, runtime_name: str) -> MonitorSettings:
    wanted = plan.monitor
    policy = parse_restart_policy(wanted.restart)
    # A native run does not use the recipe's image: name the engine build instead.
    image = plan.image_ref if runtime_name != "native" else f"native {plan.image.engine_version}"
    speculative = plan.speculative
    return MonitorSettings(
        poll_s=wanted.poll_s,
        wedge_timeout_s=wanted.wedge_timeout_s,
        livelock_s=wanted.livelock_s,
        restart_on_wedge=wanted.restart_on_wedge,
        restart_on_death=policy.on_failure,
        restart_policy=str(policy),
        # One breaker for every restart: on-failure:N sets its limit.
        max_restarts=policy.limit or wanted.max_restarts,
        restart_window_s=wanted.restart_window_h * 3600,
        restart_backoff_s=wanted.restart_backoff_s,
        ready_timeout_s=float(plan.timeouts.ready_s),
        image=image,
        plan_hash=plan.plan_hash,
        speculative_method=speculative.method if speculative else None,
        speculative_tokens=speculative.num_speculative_tokens if speculative else None,
    )


def prepare_monitor(plan: LaunchPlan, spec: LaunchSpec, runtime_name: str) -> MonitorFiles:
    """Write what the monitor needs. A launch by hand also resets the restart breaker: the
    user has looked at the server, so an earlier 'gave up' no longer holds."""
    files = monitor_files(spec.name)
    files.make_dirs()
    files.watchdog.unlink(missing_ok=True)
    # Left by a launch over several nodes under this name, it would pick the wrong monitor.
    cluster_start_path(spec.name).unlink(missing_ok=True)
    settings_from_plan(plan, runtime_name).save(files.settings)
    save_launch_spec(files.launch_spec, spec)
    return files


def keep_launch_spec(spec: LaunchSpec) -> None:
    """Without a monitor too: what the gateway starts a stopped deployment again from."""
    files = monitor_files(spec.name)
    files.make_dirs()
    save_launch_spec(files.launch_spec, spec)
    cluster_start_path(spec.name).unlink(missing_ok=True)


def prepare_cluster_monitor(plan: LaunchPlan, name: str, node_runtime: str) -> MonitorFiles:
    """The monitor of a deployment over several nodes: the same settings and breaker as on
    one host; it restarts by relaunching every node from the saved ClusterStart (see
    sm120.deploy.cluster_monitor), which the caller wrote, so no launch spec stays.
    `node_runtime` is how each node runs the engine (native or docker)."""
    files = monitor_files(name)
    files.make_dirs()
    files.launch_spec.unlink(missing_ok=True)
    files.watchdog.unlink(missing_ok=True)
    settings_from_plan(plan, node_runtime).save(files.settings)
    return files


def monitor_module(name: str) -> str:
    """What runs the deployment's monitor: over several nodes, the module that hands it the
    relaunch of every node (the monitor package cannot import deploy)."""
    return CLUSTER_MONITOR_MODULE if cluster_start_path(name).is_file() else MONITOR_MODULE


def start_for(name: str) -> int:
    return start_monitor(name, monitor_files(name), module=monitor_module(name))


def stop_for(name: str) -> bool:
    return stop_monitor(monitor_files(name))
