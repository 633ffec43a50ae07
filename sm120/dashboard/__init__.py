"""The web dashboard: one page over what `sm120 status --json` knows (deployments, the
monitor's live view, GPUs, alerts, bench history), with wake/sleep/stop/relaunch buttons.
Served by the gateway (`routes.add_dashboard` in its app) or alone by `sm120 dashboard`."""
