"""Hooking the monitor into the lifecycle: launch hands it its settings and starts it after
READY; stop and --replace end it before they touch the server."""

from __future__ import annotations

import dataclasses

from sm120.core.errors import SM120Error
from sm120.engine.runtime.base import LaunchSpec
from sm120.engine.state import deployment_dir
from sm120.monitor.files import MonitorFiles, MonitorSettings, save_launch_spec
from sm120.monitor.process import start_monitor, stop_monitor
from sm120.plan.resolve import LaunchPlan
from sm120.recipe.restart_policy import parse_restart_policy


class SupervisionError(SM120Error):
    """A restart policy that nothing would carry out."""


def check_restart_policy(plan: LaunchPlan, *, monitor: bool, multinode: bool) -> None:
    """Refuse a relaunch promise this launch cannot keep, before anything starts."""
    policy = parse_restart_policy(plan.monitor.restart)
    if not policy.on_failure:
        return
    if not monitor:
        raise SupervisionError(
            f"restart policy {policy} needs the monitor, which --no-monitor turns off",
            "drop --no-monitor, or launch with --restart no",
        )
    if multinode:
        raise SupervisionError(
            f"restart policy {policy} does not span nodes yet",
            "launch with --restart no; 'sm120 service' can restart the whole launch",
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
    settings_from_plan(plan, runtime_name).save(files.settings)
    save_launch_spec(files.launch_spec, spec)
    files.watchdog.unlink(missing_ok=True)
    return files


def keep_launch_spec(spec: LaunchSpec) -> None:
    """Without a monitor too: what the gateway starts a stopped deployment again from."""
    files = monitor_files(spec.name)
    files.make_dirs()
    save_launch_spec(files.launch_spec, spec)


def prepare_watch_only(plan: LaunchPlan, name: str, runtime_name: str) -> MonitorFiles:
    """The monitor for a deployment it cannot restart (one engine over several nodes starts
    node by node, not from one argv): logs, peaks and wedge alerts, no watchdog restarts."""
    files = monitor_files(name)
    files.make_dirs()
    settings = dataclasses.replace(
        settings_from_plan(plan, runtime_name),
        restart_on_wedge=False,
        restart_on_death=False,
        restart_policy="no",
    )
    settings.save(files.settings)
    files.launch_spec.unlink(missing_ok=True)  # without it the monitor never restarts
    files.watchdog.unlink(missing_ok=True)
    return files


def start_for(name: str) -> int:
    return start_monitor(name, monitor_files(name))


def stop_for(name: str) -> bool:
    return stop_monitor(monitor_files(name))
