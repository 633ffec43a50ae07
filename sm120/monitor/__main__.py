"""`python -m sm120.monitor`: the monitor service (what `launch` starts, and what the compose
overlay runs).

    python -m sm120.monitor --name NAME
        watch a deployment sm120 started (it may restart it, per the recipe)
    python -m sm120.monitor --url http://127.0.0.1:8000 --state-dir DIR [--api-key-file F]
        watch a server known only by its address (a compose service); files go to DIR

The monitor's lock is taken before the service is imported (sm120.monitor.lock says why), so
this module imports only what finds the state dir and takes the lock.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sm120.core.errors import SM120Error
from sm120.engine.state import check_deployment_name, deployment_dir
from sm120.monitor.lock import take_monitor_lock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120.monitor")
    parser.add_argument("--name", help="deployment name (in the sm120 state dir)")
    parser.add_argument("--url", help="server address, when there is no deployment state")
    parser.add_argument("--state-dir", help="where the monitor writes, with --url")
    parser.add_argument("--api-key-file", help="file holding the server's API key, with --url")
    args = parser.parse_args(argv)
    if not args.name and not (args.url and args.state_dir):
        parser.error("give --name, or --url with --state-dir")

    try:
        name = check_deployment_name(args.name) if args.name else None
        root = deployment_dir(name) if name else Path(args.state_dir)
        lock = take_monitor_lock(root)
        if lock is None:
            return 0
        # start-up: imported once the lock is held, not before (see the module docstring).
        from sm120.engine.secrets import read_api_key
        from sm120.monitor.files import MonitorFiles
        from sm120.monitor.process import serve

        if name:
            return serve(name, MonitorFiles(root), lock=lock)
        api_key = read_api_key(args.api_key_file)
        return serve(None, MonitorFiles(root), url=args.url, api_key=api_key, lock=lock)
    except SM120Error as exc:
        sys.stderr.write(f"Error: {exc.one_line()}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
